"""The compiled loops of fedforest_secure (``_ckernels``); everything else is in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler), the install goes on and
the library runs its numpy code, which gives the same results (tests/test_sketch_kernels.py).
"""

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup


def source_digest() -> str:
    """SHA-256 over the loops' sources, each file's name and bytes in name order; the same as
    ``fedforest_secure._kernels.source_digest``, which refuses an extension built from others."""
    h = hashlib.sha256()
    for path in sorted(Path("fedforest_secure").glob("_ckernels*.[ch]"), key=lambda p: p.name):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


setup(ext_modules=[Extension(
    "fedforest_secure._ckernels",
    sources=["fedforest_secure/_ckernels.c", "fedforest_secure/_ckernels_sketch.c",
             "fedforest_secure/_ckernels_stats.c", "fedforest_secure/_ckernels_pack.c",
             "fedforest_secure/_ckernels_order.c",
             "fedforest_secure/_ckernels_split.c", "fedforest_secure/_ckernels_pairs.c"],
    depends=["fedforest_secure/_ckernels.h"],
    # the module's SOURCE_DIGEST: what it was built from
    define_macros=[("FEDFOREST_KERNELS_DIGEST", f'"{source_digest()}"')],
    # no fused multiply-add: every operation rounds as numpy's does, so the bits agree
    extra_compile_args=["-O2", "-ffp-contract=off", "-std=c99"],
    # the project's Makefile requires it where a C compiler exists
    # (FEDFOREST_REQUIRE_KERNELS=1): a C file that does not compile then fails the install
    optional=os.environ.get("FEDFOREST_REQUIRE_KERNELS") != "1",
)])
