"""README's example of the estimators in scikit-learn's pipelines, searches and
cross-validation runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"
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
