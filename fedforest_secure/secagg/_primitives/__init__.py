"""Hazardous primitives of secure aggregation.

PRIVATE: only the recipes of ``fedforest_secure.secagg`` import them.

Nothing here knows about rounds, clients or the privacy rules; misuse (reusing a seed for two
vectors, revealing both shares of one peer, skipping the range check) silently breaks privacy or
exactness. The recipes one level up (:mod:`fedforest_secure.secagg`) enforce those rules.

* :mod:`._kdf`     X25519 agreement and HKDF-SHA256 bound to a caller-built context.
* :mod:`._prg`     AES-128-CTR expansion of a 256-bit seed into uint64 masks, added in place.
* :mod:`._shamir`  Shamir secret sharing over the Mersenne prime field 2^521 - 1.
* :mod:`._ring`    fixed-point encoding of float64 vectors into Z_{2^64} (two's complement).
"""

from __future__ import annotations
