"""``fedforest evaluate --job <job.toml>`` whose id a job on the server already has: it waits
for that job only if it is the evaluation the file describes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_cli.sim_data import schema_dict, write_schema
from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job
from fedforest_secure import FedForestClassifier
from fedforest_secure.privacy import load_profile
from server_app.admin import ServerAdmin
from server_app.jobspec import load_job_spec


def _server(tiny_parts: Any, tmp_path: Path, sites: list[str]) -> tuple[Path, Path]:
    """A server.toml whose database has ``sites``, the schema of the first three sites'
    rows in ``tmp_path``, and a model file fitted on them."""
    parts, feat = tiny_parts
    X = np.concatenate([p[0] for p in parts[:3]])
    y = np.concatenate([p[1] for p in parts[:3]])
    write_schema(tmp_path / "schema.toml", schema_dict(X, y, "classification", feat))
    model = tmp_path / "m1.json"
    model.write_text(FedForestClassifier(n_estimators=2, max_depth=2).fit(X, y).model_.to_json())
    server = tmp_path / "server.toml"
    server.write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        for site in sites:
            admin.add_client(site)
    return server, model


def _said(res: Any) -> str:
    return " ".join(res.output.split())


def test_evaluate_refuses_a_job_file_whose_id_is_a_training_jobs(
        tiny_parts: Any, job_dir: Any, tmp_path: Path) -> None:
    """The training job's own job.toml with --models (an evaluation of the same id) was
    taken for "the evaluation": the command waited for the training job, then told the
    operator to cancel it (or, the training done, read its forest as an evaluation result)."""
    parts, feat = tiny_parts
    server, model = _server(tiny_parts, tmp_path, [f"client-{k}" for k in range(3)])
    toml = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        admin.create_job(load_job_spec(toml))
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", str(toml),
                                   "--models", str(model), "--timeout", "0"])
    assert res.exit_code == 2, res.output
    assert (f"error: job 'job-a' on this server is a training job, and {toml} (an evaluation "
            "of --models) has the same id: give the evaluation its own id (`id = ...` in "
            f"{toml}, or in a copy of it) and run this command again") in _said(res)
    assert "waiting" not in res.output and "cancel" not in res.output
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        job = admin.job("job-a")
    assert job is not None and job.status == "waiting"  # the training job is left as it was


@pytest.mark.parametrize("edit, named", [
    ({"profile": "secure"}, "profile (stored: open; job file: secure)"),
    ({"clients": ["a", "b", "d"]}, "clients (stored: a, b, c; job file: a, b, d)"),
    ({"round_deadline": 90.0}, "round_deadline (stored: 60.0; job file: 90.0)"),
    ({"score_bins": 50}, "[evaluation] score_bins (stored: unset; job file: 50)"),
    ({"per_site": True}, "[evaluation] per_site (stored: false; job file: true)"),
    ({"names": ["new-label"]}, "[evaluation] names (stored: m1; job file: new-label)"),
])
def test_evaluate_refuses_an_edited_job_file_with_an_existing_evaluations_id(
        tiny_parts: Any, tmp_path: Path, edit: dict[str, Any], named: str) -> None:
    """An evaluation's job.toml edited but keeping its id was taken for the existing job,
    whose result (of the old settings) was then shown and written as the edited file's."""
    server, model = _server(tiny_parts, tmp_path, ["a", "b", "c", "d"])
    job = tmp_path / "eval.toml"
    create_eval_job(server, write_eval_job(job, "ev", list("abc"), "open", [model]))
    top = {k: v for k, v in edit.items() if k in ("profile", "clients", "round_deadline")}
    write_eval_job(job, "ev", top.get("clients", list("abc")), top.get("profile", "open"),
                   [model], deadline=top.get("round_deadline", 60.0),
                   extra={k: v for k, v in edit.items() if k not in top})
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", str(job),
                                   "--timeout", "0"])
    assert res.exit_code == 2, res.output
    assert (f"error: evaluation job ev exists with other settings than {job}: {named}. Give "
            f"this evaluation a new id in {job}, or pass --job ev to show that job's result"
            ) in _said(res)
    assert "waiting" not in res.output


def test_evaluate_refuses_a_job_file_that_relabels_the_models_it_named(
        tiny_parts: Any, tmp_path: Path) -> None:
    """The file's own ``[evaluation] names`` edited: the existing job's result, under the old
    labels, was shown and written as the edited file's (--names with the same labels is
    refused); with --models, the file's labels are not the job's and are not compared."""
    server, model = _server(tiny_parts, tmp_path, list("abc"))
    job = tmp_path / "eval.toml"
    create_eval_job(server, write_eval_job(job, "ev", list("abc"), "open", [model],
                                           names=["old-label"]))
    write_eval_job(job, "ev", list("abc"), "open", [model], names=["new-label"])
    args = ["evaluate", "--config", str(server), "--job", str(job), "--timeout", "0"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert (f"error: evaluation job ev exists with other settings than {job}: [evaluation] "
            "names (stored: old-label; job file: new-label). Give this evaluation a new id in "
            f"{job}, or pass --job ev to show that job's result") in _said(res)
    assert "waiting" not in res.output
    res = CliRunner().invoke(app, [*args, "--models", str(model), "--names", "old-label"])
    assert "evaluation job ev exists: waiting for its result" in _said(res), res.output


def _profile_job(path: Path, profile: str, privacy: dict[str, Any] | None = None) -> Path:
    doc: dict[str, Any] = {"id": "ev", "kind": "evaluate", "clients": list("abc"),
                           "profile": profile, "schema": "schema.toml", "round_deadline": 60.0,
                           "evaluation": {"models": ["m1.json"]}}
    if privacy is not None:
        doc["privacy"] = privacy
    path.write_text(tomli_w.dumps(doc))
    return path


@pytest.mark.parametrize("edit, named", [
    ("file", "site_metrics (stored: false; job file: true)"),
    ("privacy", "epsilon (stored: 1.0; job file: 2.0)"),
])
def test_evaluate_refuses_a_job_file_whose_profile_settings_changed_naming_them(
        tiny_parts: Any, tmp_path: Path, edit: str, named: str) -> None:
    """The same profile, of other settings (its file edited, or the job file's [privacy]):
    the refusal names the settings that differ."""
    server, _ = _server(tiny_parts, tmp_path, list("abc"))
    job = tmp_path / "eval.toml"
    if edit == "file":
        text = load_profile("open", name="site-open").to_toml()
        (tmp_path / "prof.toml").write_text(text)
        create_eval_job(server, _profile_job(job, "prof.toml"))
        (tmp_path / "prof.toml").write_text(text.replace("site_metrics = false",
                                                         "site_metrics = true"))
    else:
        create_eval_job(server, _profile_job(job, "secure-dp"))
        _profile_job(job, "secure-dp", {"epsilon": 2.0})
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", str(job),
                                   "--timeout", "0"])
    assert res.exit_code == 2, res.output
    assert (f"error: evaluation job ev exists with other settings than {job}: profile "
            f"settings: {named}. Give this evaluation a new id") in _said(res)


def test_evaluate_of_the_same_job_file_again_waits_for_the_existing_evaluation(
        tiny_parts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job.toml, with the same models given from another directory (a copy of the
    file, so another path and label), or the file naming that copy without labels, waits for
    the evaluation job it created."""
    server, model = _server(tiny_parts, tmp_path, list("abc"))
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", [model])
    runner = CliRunner()
    args = ["evaluate", "--config", str(server), "--job", str(job), "--timeout", "0"]
    res = runner.invoke(app, [*args, "--models", str(model)])
    assert "evaluation job ev created for 3 sites" in _said(res), res.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(model, elsewhere / "copy.json")
    monkeypatch.chdir(elsewhere)
    for extra, models in (([], [model]), (["--models", "copy.json"], [model]),
                          ([], [elsewhere / "copy.json"])):
        write_eval_job(job, "ev", list("abc"), "open", models)
        res = runner.invoke(app, [*args, *extra])
        assert res.exit_code == 2, res.output
        said = _said(res)
        assert "evaluation job ev exists: waiting for its result" in said, said
        assert "the evaluation job ev is still waiting after 0 s" in said
