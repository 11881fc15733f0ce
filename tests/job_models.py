"""A job's model on a schema with a categorical column: what a site downloads (the forest, the
schema, the site labels), as :meth:`ForestModel.for_job` makes it at the end of a job."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile
from fedforest_secure.schema import Schema


def schema_text(task: str) -> str:
    """A schema of age (continuous, may miss), cp (categorical, levels "1" "2" "4" "x"),
    chol (continuous)."""
    target = ('[target]\nname = "num"\nkind = "classification"\nclasses = ["lo", "hi"]\n'
              if task == "classification" else
              '[target]\nname = "num"\nkind = "regression"\nbounds = [-10.0, 10.0]\n')
    return (target
            + '[[features]]\nname = "age"\nkind = "continuous"\nbounds = [0.0, 120.0]\n'
            + 'missing = "allowed"\n'
            + '[[features]]\nname = "cp"\nkind = "categorical"\nlevels = ["1", "2", "4", "x"]\n'
            + '[[features]]\nname = "chol"\nkind = "continuous"\nbounds = [100.0, 400.0]\n')


def site_rows(task: str, n: int = 600, seed: int = 0, by_chol: bool = False
              ) -> tuple[pd.DataFrame, np.ndarray]:
    """A site's feature columns as its CSV holds them (cp as its levels), and the target: set
    by cp and chol, or by chol alone."""
    rng = np.random.default_rng(seed)
    rows = pd.DataFrame({"age": rng.uniform(20, 80, n), "cp": rng.choice(["1", "2", "4", "x"], n),
                         "chol": rng.uniform(100, 400, n)})
    sick = (rows["chol"].to_numpy() > 250 if by_chol
            else rows["cp"].isin(["4", "x"]).to_numpy())
    y: np.ndarray = (np.where(sick, "hi", "lo") if task == "classification"
                     else np.where(sick, 5.0, -3.0) + rows["age"].to_numpy() / 100)
    return rows, y


def job_model_file(tmp_path: Path, task: str, profile: str = "secure-dp", by_chol: bool = False,
                   **kw: Any) -> Path:
    """The model file of a job on :func:`schema_text`, trained on the schema's codes (cp as its
    level index) with ``profile`` (secure-dp: random splits, which split cp numerically)."""
    schema = Schema.from_dict(tomllib.loads(schema_text(task)))
    rows, y = site_rows(task, by_chol=by_chol)
    codes, target, _ = schema.validate_table(rows.assign(num=y), with_target=True)
    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    prof = load_profile(profile, **({"epsilon": 4.0} if profile == "secure-dp" else {}))
    forest = cls(profile=prof, random_state=0, **kw).fit(
        codes, target, client=np.arange(len(rows)) % 3).model_
    path = tmp_path / f"{task}.json"
    path.write_text(forest.for_job(schema_text(task), ["s1", "s2", "s3"]).to_json())
    return path
