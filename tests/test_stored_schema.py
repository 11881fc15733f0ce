"""A schema a model or a job already carries is read as written: a model file whose schema
lists one number twice among its levels (``"1"`` and ``"1.0"``, written before such schemas
were refused) loads and predicts as trained, while a schema file, a job's
schema and a draft list each number once. A training job's model carries its job's schema,
or none for a job created with ``[data]`` facts; a stored schema that is not valid is an error,
never dropped."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from test_evaluation_trained_schema import SCHEMA, SITES, _evaluation, _rows

from fedforest_secure import FedForestClassifier
from fedforest_secure.errors import SchemaError
from fedforest_secure.model import ForestModel
from fedforest_secure.schema import Schema
from server_app.jobspec import parse_schema
from server_app.settings import ConfigError

#: SCHEMA with grade's levels "1", "2", "1.0": codes 0, 1, 2 as the trees learnt them
TWINS = SCHEMA.replace('levels = ["low", "mid", "high"]', 'levels = ["1", "2", "1.0"]')
TWINS_REFUSED = (
    "features[1] ('grade').levels: levels '1' and '1.0' are the same number: sites that "
    "write it as 1 and as 1.0 would give one category two codes (a cell matches a label by "
    "its number); list each number once")


def _twin_model() -> ForestModel:
    """A training job's model on TWINS: y is 1 where grade is the level "1.0" (code 2)."""
    X, y = _rows()
    forest = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(len(y)) % 2).model_
    return forest.for_job(TWINS, SITES)


def test_a_job_on_a_schema_with_number_twins_gives_a_model_with_that_schema() -> None:
    model = _twin_model()
    assert model.schema == Schema.from_dict(tomllib.loads(TWINS), stored=True).to_dict()
    assert model.feature_names == ["x", "grade"] and model.classes == ["0", "1"]


def test_a_model_file_whose_schema_lists_one_number_twice_loads_and_predicts(
        tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _twin_model().save(path)
    rows = np.array([["5", "1.0"], ["5", "1"], ["5", "2"]], dtype=object)  # exact labels
    want = [1, 0, 0]
    assert ForestModel.load(path).predict(rows).tolist() == want
    assert ForestModel.from_json(path.read_text()).predict(rows).tolist() == want
    est = FedForestClassifier.load(path)
    assert est.predict(rows).tolist() == ["1", "0", "0"]
    # an evaluation reads the model and names how its schema differs from the job's (the
    # job's schema lists each number once, so its sites cannot encode "1.0" as code 2)
    once = SCHEMA.replace('levels = ["low", "mid", "high"]', 'levels = ["1", "2"]')
    with pytest.raises(ConfigError) as err:
        _evaluation(path.read_text(), once)
    assert "differs from the job's schema: feature 'grade' has the levels '1', '2', '1.0' " \
           "there, in this order, and '1', '2' in the job's schema. The sites" in str(err.value)


def test_a_schema_file_or_a_jobs_schema_with_number_twins_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "schema.toml"
    path.write_text(TWINS)
    with pytest.raises(SchemaError) as exc:
        Schema.load(path)
    assert str(exc.value) == f"invalid schema file {path}: {TWINS_REFUSED}"
    with pytest.raises(ConfigError) as err:
        parse_schema(TWINS, path)
    assert str(err.value) == f"invalid schema file {path}: {TWINS_REFUSED}"


def test_a_jobs_data_facts_give_a_model_without_a_schema() -> None:
    X, y = _rows()
    forest = FedForestClassifier(n_estimators=1, max_depth=1, random_state=0).fit(
        X, y, client=np.arange(len(y)) % 2).model_
    facts = json.dumps({"task": "classification", "n_features": 2, "n_classes": 2})
    for text in (None, facts, "{}"):
        model = forest.for_job(text, SITES)
        assert model.schema is None and model.clients == SITES


@pytest.mark.parametrize("text, said", [
    (SCHEMA.replace("bounds = [0.0, 10.0]", "bounds = [10.0, 0.0]"),
     "invalid schema: features[0] ('x').bounds: lower bound must be < upper bound, got "
     "[10.0, 0.0]"),
    ('[target]\nname = "y"\n', "invalid schema: features: Field required; target.kind: "
     "Field required"),
    ("[target\n", "cannot parse the job's schema: Expected ']' at the end of a table "
                  "declaration (at line 1, column 8)"),
])
def test_a_jobs_stored_schema_that_is_not_valid_is_an_error_not_dropped(
        text: str, said: str) -> None:
    X, y = _rows()
    forest = FedForestClassifier(n_estimators=1, max_depth=1, random_state=0).fit(
        X, y, client=np.arange(len(y)) % 2).model_
    with pytest.raises(SchemaError) as exc:
        forest.for_job(text, SITES)
    assert str(exc.value) == said


def test_a_job_whose_stored_schema_is_not_valid_fails_with_the_reason(
        tmp_path: Path, tiny_parts, job_dir) -> None:  # type: ignore[no-untyped-def]
    """Its model would have no schema, feature names or class labels: the job fails once
    training is over, saying why, and stores no model."""
    from state_driver import answer_until_done, join_sites

    from server_app.audit_hook import NullAudit
    from server_app.auth import add_client
    from server_app.db import Database, JobRow
    from server_app.jobspec import load_job_spec
    from server_app.runtime import ServerState

    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    for k in range(2):
        add_client(db, f"client-{k}")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=2,
                                           trees=1, depth=1)))
    with db.session() as sess:  # as a job an earlier version took could hold it
        job = sess.get(JobRow, "job-a")
        assert job is not None
        spec = json.loads(job.spec_json)
        spec["schema_text"] = '[target]\nname = "y"\n'
        job.spec_json = json.dumps(spec)

    def status() -> tuple[str, str, str | None]:
        with db.session() as sess:
            row = sess.get(JobRow, "job-a")
            assert row is not None
            return row.status, row.reason, row.model_json

    rows, workers = join_sites(db, state, "job-a", parts[:2])
    assert not answer_until_done(state, "job-a", rows, workers,
                                 stop=lambda: status()[0] in ("done", "failed"))
    assert status() == (
        "failed", "training finished, but the model cannot carry the job's schema (invalid "
        "schema: features: Field required; target.kind: Field required); no model was "
        "stored", None)
    db.dispose()
