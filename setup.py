"""The compiled loops of fedforest_secure (``_ckernels``); everything else is in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler), the install goes on and
the library runs its numpy code, which gives the same results (tests/test_sketch_kernels.py).
"""

import os

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "fedforest_secure._ckernels",
    sources=["fedforest_secure/_ckernels.c", "fedforest_secure/_ckernels_sketch.c",
             "fedforest_secure/_ckernels_stats.c", "fedforest_secure/_ckernels_pack.c",
             "fedforest_secure/_ckernels_order.c"],
    depends=["fedforest_secure/_ckernels.h"],
    # no fused multiply-add: every operation rounds as numpy's does, so the bits agree
    extra_compile_args=["-O2", "-ffp-contract=off", "-std=c99"],
    # the project's Makefile requires it where a C compiler exists
    # (FEDFOREST_REQUIRE_KERNELS=1): a C file that does not compile then fails the install
    optional=os.environ.get("FEDFOREST_REQUIRE_KERNELS") != "1",
)])
