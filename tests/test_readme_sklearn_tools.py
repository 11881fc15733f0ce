"""README's Python examples run as written: the first (the estimators on the four hospitals'
Heart Disease files) and the one of the estimators in scikit-learn's pipelines, searches and
cross-validation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
HEART_FILES = tuple(f"processed.{site}.data"
                    for site in ("cleveland", "hungarian", "switzerland", "va"))
HEADING = "### With scikit-learn's pipelines, searches and cross-validation"


def test_the_readme_example_of_client_in_pipelines_and_cross_validation_runs() -> None:
    """client= through params=, GridSearchCV.fit and a Pipeline's <step>__client; a
    split_on_client forest scored in cross_val_score under metadata routing: finite scores."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index(HEADING):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)  # noqa: S102 - the docs' code
    scores = np.asarray(scope["scores"])
    assert scores.shape == (3,) and np.isfinite(scores).all() and (scores > 0.2).all()


def test_the_readme_first_example_runs_on_the_four_hospitals_files_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first Python block, run in a directory holding only the four UCI files it names:
    a secure forest over the four hospitals, its sklearn and ONNX exports, save and load."""
    from fedforest_secure import FedForestClassifier
    from fedforest_secure.errors import FedForestError
    from fedforest_secure.experiments.loaders import shared_data_dir

    try:
        source = shared_data_dir() / "heart_disease"
    except FedForestError:
        pytest.skip("shared data directory (../shared/data or $FEDFOREST_DATA_DIR) is missing")
    for name in HEART_FILES:
        (tmp_path / name).write_bytes((source / name).read_bytes())
    monkeypatch.chdir(tmp_path)
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)  # noqa: S102 - the docs' code
    model = scope["model"]
    assert isinstance(model, FedForestClassifier)
    assert list(model.clients_) == ["cleveland", "hungarian", "switzerland", "va"]
    assert model.predict_proba(scope["X_new"]).shape == (5, 2)
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "model.json").is_file()
