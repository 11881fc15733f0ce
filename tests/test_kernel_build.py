"""The compiled loops are used only when they were built from the sources beside them: an
extension left from other sources (a `git pull` without reinstalling) falls back to the numpy
code with a warning instead of failing on a loop it lacks or computing with an old one."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from fedforest_secure import _kernels


def _stale(digest: str | None) -> types.ModuleType:
    mod = types.ModuleType("fedforest_secure._ckernels")
    if digest is not None:
        mod.SOURCE_DIGEST = digest  # type: ignore[attr-defined]
    return mod


@pytest.mark.parametrize("digest", [None, "", "0" * 64], ids=["none", "empty", "other"])
def test_an_extension_built_from_other_sources_is_not_used(
        monkeypatch: pytest.MonkeyPatch, digest: str | None) -> None:
    monkeypatch.delenv("FEDFOREST_NUMPY_KERNELS", raising=False)
    monkeypatch.setattr(_kernels.importlib, "import_module", lambda name: _stale(digest))
    with pytest.warns(RuntimeWarning, match=r"built from other sources .*`make install`"):
        assert _kernels.compiled() is None


def test_an_extension_built_from_these_sources_is_used(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.delenv("FEDFOREST_NUMPY_KERNELS", raising=False)
    mod = _stale(_kernels.source_digest())
    monkeypatch.setattr(_kernels.importlib, "import_module", lambda name: mod)
    assert _kernels.compiled() is mod


def test_the_installed_extension_is_built_from_the_sources_beside_it() -> None:
    try:
        import fedforest_secure._ckernels as ext
    except ImportError:  # pragma: no cover - a build without a C compiler
        pytest.skip("the compiled loops are not built here")
    assert ext.SOURCE_DIGEST == _kernels.source_digest()


def test_the_digest_covers_every_kernel_source() -> None:
    here = Path(_kernels.__file__).parent
    names = sorted(p.name for p in here.glob("_ckernels*.[ch]"))
    assert "_ckernels.c" in names and "_ckernels.h" in names
    setup = (here.parent / "setup.py").read_text()
    for name in names:
        if name.endswith(".c"):
            assert f"fedforest_secure/{name}" in setup  # built, hence digested
