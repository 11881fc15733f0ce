"""A training job's model carries the schema it was trained on; an evaluation job's sites
encode their held-out rows with the job's schema. Where the two encode rows otherwise (a
categorical feature's levels in another order, another kind, missing cells the model never
learnt, regression bounds that would clip its predictions) the job is refused when it is
created, and a site refuses it before joining; what only narrows the rows a site accepts (a
continuous feature's bounds, missing cells forbidden, wider regression bounds) may differ."""

from __future__ import annotations

import dataclasses
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_app import runner
from client_app.log import SiteLog
from client_app.runner import ClientOptions
from client_app.state import ClientState
from fedforest_secure import FedForestClassifier, FedForestRegressor
from fedforest_secure.errors import FedForestError
from fedforest_secure.evaluation import EvalSpec
from fedforest_secure.evaluation.inprocess import eval_config
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.pinning import schema_facts
from fedforest_secure.schema import Schema
from server_app.evaljob import EvaluationParams, evaluation_of
from server_app.settings import ConfigError

SCHEMA = '''[target]
name = "y"
kind = "classification"
classes = ["0", "1"]

[[features]]
name = "x"
kind = "continuous"
bounds = [0.0, 10.0]

[[features]]
name = "grade"
kind = "categorical"
levels = ["low", "mid", "high"]
'''
#: the same schema, its levels in another order (re-drafted: `schema draft` sorts them)
REORDERED = SCHEMA.replace('["low", "mid", "high"]', '["high", "low", "mid"]')
SITES = ["site-a", "site-b"]
FACTS = {"task": "classification", "n_features": 2, "n_classes": 2}


def _rows(n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """``x`` uniform on [0, 10] and ``grade`` as its codes under SCHEMA; y = grade is high."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(0, 10, n), rng.integers(0, 3, n).astype(float)])
    return X, (X[:, 1] == 2).astype(int)


def _job_model(schema_text: str = SCHEMA) -> str:
    """A training job's model on ``schema_text`` (the file the server stores)."""
    X, y = _rows()
    forest = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(len(y)) % 2).model_
    return forest.for_job(schema_text, SITES).to_json()


def _evaluation(model: str, schema_text: str,
                facts: dict[str, Any] | None = None) -> dict[str, Any] | None:
    return evaluation_of("evaluate", EvaluationParams(models=["m.json"], model_texts=[model],
                                                       names=["m"]),
                         Schema.from_dict(tomllib.loads(schema_text)), facts or FACTS)


LEVELS_REFUSED = (
    "evaluation: model 'm' was trained on a schema that differs from the job's schema: "
    "feature 'grade' has the levels 'low', 'mid', 'high' there, in this order, and 'high', "
    "'low', 'mid' in the job's schema. The sites encode their held-out rows with the job's "
    "schema, so they would score the model on other codes than it was trained on: evaluate "
    "it under the schema of its training job (the model file's \"schema\"), or evaluate a "
    "model trained on this schema")


def test_a_job_whose_schema_lists_the_models_levels_in_another_order_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        _evaluation(_job_model(), REORDERED)
    assert str(err.value) == LEVELS_REFUSED


def test_a_job_on_the_models_own_schema_is_taken() -> None:
    spec = _evaluation(_job_model(), SCHEMA)
    assert spec is not None and spec["names"] == ["m"]


@pytest.mark.parametrize("old, new, difference", [
    ('levels = ["low", "mid", "high"]', 'levels = ["none", "low", "mid", "high"]',
     "feature 'grade' has the levels 'low', 'mid', 'high' there, in this order, and 'none', "
     "'low', 'mid', 'high' in the job's schema"),
    ('kind = "categorical"\nlevels = ["low", "mid", "high"]',
     'kind = "continuous"\nbounds = [0.0, 2.0]',
     "feature 'grade' is categorical there and continuous in the job's schema"),
    ('levels = ["low", "mid", "high"]\n', 'levels = ["low", "mid", "high"]\nmissing = "allowed"\n',
     "feature 'grade' has missing = 'forbidden' there and 'allowed' in the job's schema"),
])
def test_a_job_whose_schema_encodes_a_feature_otherwise_is_refused(
        old: str, new: str, difference: str) -> None:
    assert old in SCHEMA
    with pytest.raises(ConfigError) as err:
        _evaluation(_job_model(), SCHEMA.replace(old, new))
    assert f"differs from the job's schema: {difference}. The sites" in str(err.value)


def test_a_continuous_features_bounds_may_differ_from_the_models() -> None:
    """They decide which values a site accepts; a value is encoded as itself either way."""
    wider = SCHEMA.replace("bounds = [0.0, 10.0]", "bounds = [0.0, 1000.0]")
    assert _evaluation(_job_model(), wider) is not None


def test_a_feature_the_model_may_miss_may_be_forbidden_to_miss_in_the_job() -> None:
    """The job's sites then send only rows with the cell, encoded as the model read them."""
    allowed = SCHEMA.replace('levels = ["low", "mid", "high"]\n',
                             'levels = ["low", "mid", "high"]\nmissing = "allowed"\n')
    assert _evaluation(_job_model(allowed), SCHEMA) is not None


REGRESSION = '''[target]
name = "y"
kind = "regression"
bounds = [0.0, 10.0]

[[features]]
name = "x"
kind = "continuous"
bounds = [0.0, 10.0]

[[features]]
name = "grade"
kind = "categorical"
levels = ["low", "mid", "high"]
'''


@pytest.mark.parametrize("bounds, taken", [
    ("[0.0, 10.0]", True), ("[0.0, 100.0]", True), ("[-5.0, 10.0]", True),
    ("[0.0, 5.0]", False), ("[5.0, 20.0]", False)])
def test_a_regression_job_is_refused_only_where_its_target_bounds_would_clip_the_model(
        bounds: str, taken: bool) -> None:
    """The job's target bounds decide which targets its sites accept and where predictions
    are clipped: bounds containing the model's (a forest predicts within them) score its own
    predictions; narrower ones would clip them."""
    X, _ = _rows()
    forest = FedForestRegressor(n_estimators=2, max_depth=2, random_state=0).fit(
        X, X[:, 0], client=np.arange(len(X)) % 2).model_
    model = forest.for_job(REGRESSION, SITES).to_json()
    facts = {"task": "regression", "n_features": 2}
    job = REGRESSION.replace("bounds = [0.0, 10.0]\n\n[[features]]",
                             f"bounds = {bounds}\n\n[[features]]", 1)
    if taken:
        assert _evaluation(model, job, facts) is not None
        return
    with pytest.raises(ConfigError) as err:
        _evaluation(model, job, facts)
    assert (f"differs from the job's schema: the target's bounds are [0.0, 10.0] there and "
            f"{bounds} in the job's schema, which would clip its predictions (the job's "
            "bounds must contain the model's). The sites") in str(err.value)


def _server(tmp_path: Path, schema_text: str) -> tuple[Path, Path]:
    """A server.toml whose database has the two sites, and an evaluation job file on
    ``schema_text`` naming a training job's model on SCHEMA."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    (tmp_path / "model.json").write_text(_job_model())
    (tmp_path / "schema.toml").write_text(schema_text)
    server = tmp_path / "server.toml"
    server.write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    for site in SITES:
        assert CliRunner().invoke(app, ["server", "add-client", site, "--config",
                                        str(server)]).exit_code == 0
    job = tmp_path / "eval.toml"
    job.write_text('id = "ev"\nkind = "evaluate"\nclients = ["site-a", "site-b"]\n'
                   'schema = "schema.toml"\nprofile = "open"\n\n[evaluation]\n'
                   'models = ["model.json"]\n')
    return server, job


@pytest.mark.parametrize("schema_text, refused", [(REORDERED, True), (SCHEMA, False)])
def test_create_job_refuses_a_model_trained_on_other_levels_naming_the_difference(
        tmp_path: Path, schema_text: str, refused: bool) -> None:
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from server_app.admin import ServerAdmin

    server, job = _server(tmp_path, schema_text)
    res = CliRunner().invoke(app, ["server", "create-job", "--config", str(server),
                                   "--job", str(job)], env={"COLUMNS": "400"})
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        created = admin.job("ev") is not None
    if refused:
        assert res.exit_code != 0 and not created
        said = " ".join(res.output.split())
        assert "feature 'grade' has the levels 'low', 'mid', 'high' there, in this order, " \
               "and 'high', 'low', 'mid' in the job's schema" in said, res.output
        assert "Traceback" not in res.output
    else:
        assert res.exit_code == 0 and created, res.output


# --- the site's side: a server that created such a job anyway ---

def _offer(tmp_path: Path, site_schema: str) -> tuple[Any, list[tuple[str, object]], Any]:
    """A site whose schema file is ``site_schema`` offered an evaluation job of the model
    on SCHEMA (the offer names no schema digest, as a server that created the job anyway
    could send it); returns the options, what the site posts, and the transport."""
    spec = EvalSpec(models=(_job_model(),), names=("m",))
    facts = schema_facts(Schema.from_dict(tomllib.loads(SCHEMA)))  # the job's, as the site's
    cfg = dataclasses.replace(
        eval_config("ev", spec, task="classification", n_features=2, n_clients=2,
                    n_classes=2, profile=load_profile("open").to_dict()),
        **facts)
    (tmp_path / "s.toml").write_text(site_schema)
    posted: list[tuple[str, object]] = []

    class Joined(Exception):
        pass

    class Offering:
        def get_json(self, path: str, params: object = None) -> object:
            return {"job_id": "ev", "client_index": 0, "client_name": "site-a",
                    "config": json.loads(cfg.to_json()), "status": "waiting"}

        def post_json(self, path: str, body: object = None) -> object:
            posted.append((path, body))
            if path.endswith("/join"):
                raise Joined
            return {"status": "declined"}

    opts = ClientOptions(server="https://fedforest.example.org", token="t", job="ev",
                         data=None, eval_data=tmp_path / "held.csv", schema=tmp_path / "s.toml",
                         ca=None, state_dir=tmp_path / "state", quiet=True)
    return opts, posted, (Offering(), Joined)


@pytest.mark.parametrize("site_schema, refused", [(REORDERED, True), (SCHEMA, False)])
def test_a_site_whose_schema_file_encodes_otherwise_than_the_models_declines_before_joining(
        tmp_path: Path, site_schema: str, refused: bool) -> None:
    opts, posted, (tr, joined) = _offer(tmp_path, site_schema)
    state = ClientState(tmp_path / "state")
    X, y = _rows(20)
    if not refused:
        with pytest.raises(joined):  # every check before joining passed
            runner._run(opts, tr, state, None, None, SiteLog(stream=io.StringIO()), None,
                        (X, y))
        assert posted == [("/v1/jobs/ev/join", posted[0][1])]
        return
    with pytest.raises(FedForestError) as err:
        runner._run(opts, tr, state, None, None, SiteLog(stream=io.StringIO()), None, (X, y))
    assert str(err.value) == (
        "model 'm' was trained on a schema that differs from this site's schema file: "
        "feature 'grade' has the levels 'low', 'mid', 'high' there, in this order, and "
        "'high', 'low', 'mid' in this site's schema file. This site would score the model on "
        "other codes than it was trained on: the server's operator can evaluate it under the "
        "schema of its training job (the model file's \"schema\"), or evaluate a model "
        "trained on this schema")
    assert posted == [("/v1/jobs/ev/decline", {"reason": "job_config"})]
