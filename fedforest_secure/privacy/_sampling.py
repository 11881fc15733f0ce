"""Vectorised noise samplers and their randomness source (private; use :mod:`.dp`).

Randomness for noise comes from a cryptographic source: :class:`ChaChaRandom` expands a full
256-bit key (fresh from :mod:`secrets` unless a test passes one) with ChaCha20 into uniform
doubles. Any object with a ``random(size) -> ndarray`` method works too (a numpy ``Generator``),
which the statistical tests use for reproducibility.

The discrete Gaussian sampler is Algorithm 3 of Canonne, Kamath & Steinke, "The Discrete Gaussian
for Differential Privacy" (NeurIPS 2020) — the algorithm diffprivlib's ``GaussianDiscrete``
implements one value at a time — vectorised over numpy arrays:

1. ``t = floor(sigma) + 1``; draw ``Y = G1 - G2`` with ``G1, G2`` i.i.d. geometric
   (``P(G >= k) = exp(-k / t)``), so ``P(Y = y) ∝ exp(-|y| / t)`` (discrete Laplace).
2. Accept ``Y`` with probability ``exp(-(|Y| - sigma**2 / t)**2 / (2 sigma**2))``; the accepted
   values are exactly ``N_Z(0, sigma**2)``: ``P(x) ∝ exp(-x**2 / (2 sigma**2))``.

Geometric variates come from inversion (``floor(-t * log(1 - U))``) and the Bernoulli from a
uniform comparison, in double precision. Like diffprivlib's floating-point ``bernoulli_neg_exp``
this is not the exact-arithmetic sampler of the paper; the per-value error is below 2**-50.
"""

from __future__ import annotations

import math
import secrets
from typing import Protocol

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from numpy.typing import NDArray

__all__ = ["MAX_SIGMA", "ChaChaRandom", "RandomSource", "discrete_gaussian_bound",
           "sample_discrete_gaussian"]

#: :func:`sample_discrete_gaussian` draws scales below this one (its int64 arithmetic is exact
#: there); a DP job's noise plan is checked against it before any round
#: (:func:`~._calibration.check_sampling`).
MAX_SIGMA = 2.0**45


class RandomSource(Protocol):
    """Anything that draws uniform doubles in [0, 1) (e.g. ``numpy.random.Generator``)."""

    def random(self, size: int) -> NDArray[np.float64]: ...


class ChaChaRandom:
    """Uniform doubles from a ChaCha20 keystream.

    Parameters
    ----------
    key : bytes, optional
        32-byte key. Default: fresh from :func:`secrets.token_bytes`. Pass a fixed key only in
        tests.
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = secrets.token_bytes(32)
        if not isinstance(key, bytes) or len(key) != 32:
            raise ValueError("ChaChaRandom needs a 32-byte key")
        self._enc = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor()

    def random(self, size: int) -> NDArray[np.float64]:
        """Draw ``size`` uniform doubles in [0, 1) (53 random bits each)."""
        if size < 0:
            raise ValueError("size must be >= 0")
        raw = self._enc.update(bytes(8 * size))
        words = np.frombuffer(raw, dtype="<u8") >> np.uint64(11)
        return words.astype(np.float64) * 2.0**-53


def _geometric(rng: RandomSource, t: float, size: int) -> NDArray[np.float64]:
    u = rng.random(size)
    return np.floor(-t * np.log1p(-u))


#: ``-log(1 - u)`` for the largest uniform double below 1 (``1 - 2**-53``) is ``53 ln 2``, 36.74
_MAX_GEOMETRIC_RATE = 37.0


def discrete_gaussian_bound(sigma: float) -> int:
    """The largest ``|value|`` :func:`sample_discrete_gaussian` can return for ``sigma``.

    A draw is a difference of two geometric variates ``floor(-t * log(1 - U))``,
    ``t = floor(sigma) + 1``, each below ``37 t`` for every double ``U < 1`` (53 bits): a hard
    bound, not a tail probability. Bounds what a site's noise can add to a sum."""
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    return 0 if sigma == 0 else math.ceil(_MAX_GEOMETRIC_RATE * (math.floor(sigma) + 1.0))


def sample_discrete_gaussian(
    sigma: float, size: int, rng: RandomSource | None = None
) -> NDArray[np.int64]:
    """Draw ``size`` i.i.d. samples of the discrete Gaussian ``N_Z(0, sigma**2)``.

    Parameters
    ----------
    sigma : float
        Scale (>= 0; 0 gives zeros). Same parameterisation as diffprivlib's ``GaussianDiscrete``.
    size : int
    rng : RandomSource, optional
        Default: a fresh :class:`ChaChaRandom`.

    Returns
    -------
    ndarray of shape (size,), int64
    """
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if sigma >= MAX_SIGMA:
        raise ValueError(f"sigma {sigma} is too large for exact int64 sampling")
    if size < 0:
        raise ValueError("size must be >= 0")
    out = np.zeros(size, dtype=np.int64)
    if sigma == 0 or size == 0:
        return out
    src: RandomSource = ChaChaRandom() if rng is None else rng
    t = math.floor(sigma) + 1.0
    s2 = sigma * sigma
    filled = 0
    while filled < size:
        need = size - filled
        batch = int(need * 2.2) + 16  # acceptance is >= ~0.5 for every sigma
        y = _geometric(src, t, batch) - _geometric(src, t, batch)
        accept = src.random(batch) < np.exp(-((np.abs(y) - s2 / t) ** 2) / (2.0 * s2))
        vals = y[accept][:need]
        out[filled : filled + vals.size] = vals.astype(np.int64)
        filled += vals.size
    return out
