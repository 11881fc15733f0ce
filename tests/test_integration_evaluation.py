"""Federated evaluation over HTTPS: a real server (uvicorn, TLS, mTLS) and three client
processes per job on 127.0.0.1, scoring two models on held-out rows that never leave the sites.

One server runs three evaluation jobs at once (profiles open, secure, secure-dp); the tests
compare each job's metrics with scikit-learn's on the pooled held-out rows."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from ports import free_port
from sklearn import metrics as skm

from fedforest_cli.sim_data import SiteData, schema_dict, write_csv, write_schema
from fedforest_cli.sim_evaluation import (
    EvalRun,
    create_eval_job,
    run_eval_clients,
    write_eval_job,
)
from fedforest_cli.sim_processes import child_env
from fedforest_cli.simulate import (
    start_server,
    wait_for_job,
    wait_healthy,
    write_server_config,
)
from fedforest_secure.audit import AuditLog, contains_per_client_plaintext, verify_log
from fedforest_secure.config import JobConfig
from fedforest_secure.evaluation.stats import bin_index
from fedforest_secure.federation import run_in_process
from fedforest_secure.model import ForestModel
from fedforest_secure.pki import init_dev_pki
from server_app.auth import add_client
from server_app.db import Database
from server_app.settings import load_settings

pytestmark = pytest.mark.integration

TOL = 1e-9
PROFILES = ("open", "secure", "secure-dp")
SITES = 3


def _train(parts: list[tuple[np.ndarray, np.ndarray]], depth: int) -> ForestModel:
    config = JobConfig(job_id="train", task="classification", n_features=4, n_clients=SITES,
                       n_classes=2, n_estimators=3, max_depth=depth, n_bins=8,
                       min_samples_leaf=3, max_features=2, criterion="gini",
                       profile={"name": "open", "secure_aggregation": False,
                                "sketch": "quantiles", "h_splits": "off"})
    return run_in_process(config, parts)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, tiny_parts: Any) -> dict[str, Any]:
    parts, feat = tiny_parts
    root = tmp_path_factory.mktemp("eval-https")
    train = [(X[:40], y[:40]) for X, y in parts[:SITES]]
    held = [(X[40:], y[40:]) for X, y in parts[:SITES]]
    X_all = np.concatenate([X for X, _ in parts[:SITES]])
    y_all = np.concatenate([y for _, y in parts[:SITES]])
    write_schema(root / "schema.toml", schema_dict(X_all, y_all, "classification", feat))
    models = {}
    for name, depth in (("shallow", 1), ("deep", 3)):
        models[name] = _train(train, depth)
        (root / f"{name}.json").write_text(models[name].to_json())
    names = [f"client-{k}" for k in range(SITES)]
    csvs = []
    for k, (X, y) in enumerate(held):
        csvs.append(root / f"{names[k]}.test.csv")
        write_csv(csvs[-1], X, y, feat, "classification")
    certs = root / "certs"
    init_dev_pki(certs, SITES, client_names=names)
    server_toml = write_server_config(root, free_port(), certs)
    settings = load_settings(server_toml)
    db = Database(settings.database)
    tokens = [add_client(db, n) for n in names]
    db.dispose()
    for prof in PROFILES:
        # the open job: `fedforest evaluate` creates it with the models of its command line,
        # waits for the sites, then writes the table and the plot next to the models
        given = [] if prof == "open" else [root / "shallow.json", root / "deep.json"]
        job = write_eval_job(root / f"eval-{prof}.toml", f"eval-{prof}", names, prof, given,
                             deadline=240.0, extra={"score_bins": 20, "log_loss_floor": 1e-3})
        if prof != "open":
            create_eval_job(server_toml, job)
    url = f"https://127.0.0.1:{settings.port}"
    server = start_server(server_toml, root / "server.log")
    runs: dict[str, EvalRun] = {}
    cli = subprocess.Popen(
        [sys.executable, "-m", "fedforest_cli", "evaluate", "--config", str(server_toml),
         "--job", str(root / "eval-open.toml"), "--models", str(root / "shallow.json"),
         str(root / "deep.json"), "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env())
    try:
        # a server's start-up on a loaded 2-core box can take over a minute
        wait_healthy(url, certs / "ca.pem", server, timeout=240, cert=certs / "client-0.pem",
                     key=certs / "client-0.key")
        wait_for_job(root / "server.db", "eval-open", timeout=240)
        sites = [SiteData(n, csvs[k], root / "schema.toml", tokens[k], *held[k])
                 for k, n in enumerate(names)]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(len(PROFILES)) as pool:
            futures = {prof: pool.submit(run_eval_clients, sites, csvs, url, f"eval-{prof}",
                                         certs, root / prof, root / "server.db", profile=prof,
                                         timeout=300)
                       for prof in PROFILES}
            runs = {prof: f.result() for prof, f in futures.items()}
        cli_out = cli.communicate(timeout=240)[0].decode()
    finally:
        for proc in (cli, server):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        if cli.stdout is not None:  # unread when the set-up failed: closed, not left to gc
            cli.stdout.close()
    return {"runs": runs, "models": models, "held": held, "root": root, "cli": cli_out,
            "cli_code": cli.returncode}


def _pooled(data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    X = np.concatenate([X for X, _ in data["held"]])
    y = np.concatenate([y for _, y in data["held"]])
    return X, y


@pytest.mark.parametrize("profile", ["open", "secure"])
def test_federated_metrics_over_https_equal_the_pooled_held_out_metrics(
        evaluated: dict[str, Any], profile: str) -> None:
    run = evaluated["runs"][profile]
    assert run.exit_codes == [0] * SITES
    X, y = _pooled(evaluated)
    for name, model in evaluated["models"].items():
        m = run.result.model(name).metrics
        p = model.predict_values(X)
        pred = p.argmax(axis=1)
        assert m["n"] == len(y)
        assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred), abs=TOL)
        assert m["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, pred),
                                                       abs=TOL)
        assert m["f1_macro"] == pytest.approx(skm.f1_score(y, pred, average="macro"), abs=TOL)
        clipped = np.clip(p, 1e-3, 1 - 1e-3)
        assert m["log_loss"] == pytest.approx(float(np.mean(-np.log(clipped[np.arange(len(y)),
                                                                          y]))), abs=TOL)
        assert m["brier"] == pytest.approx(skm.brier_score_loss(y, p[:, 1]), abs=TOL)
        assert m["roc_auc"] == pytest.approx(skm.roc_auc_score(y, bin_index(p[:, 1], 20)),
                                             abs=TOL)
    other = evaluated["runs"]["secure" if profile == "open" else "open"]
    assert run.result.models[1].metrics == other.result.models[1].metrics


def test_a_done_evaluation_jobs_status_speaks_of_an_evaluation_not_of_trees(
        evaluated: dict[str, Any]) -> None:
    """`fedforest status` / `server status` / the operator page: an evaluation has no tree
    levels, and what it completed is an evaluation."""
    import time

    from server_app.db import JobRow
    from server_app.status import job_status

    db = Database(f"sqlite:///{evaluated['root'] / 'server.db'}")
    with db.session() as sess:
        for prof in PROFILES:
            job = sess.get(JobRow, f"eval-{prof}")
            assert job is not None
            st = job_status(sess, job, None, time.time())
            assert (st["status"], st["reason"]) == ("done", "evaluation complete"), st
            assert st["max_depth"] is None and st["level"] is None and st["rounds_done"] == 1
    db.dispose()


def test_every_evaluation_aggregate_is_in_the_audit_log(evaluated: dict[str, Any]) -> None:
    db = evaluated["root"] / "audit.db"
    report = verify_log(db, replay=True)
    assert report.ok, report.problems
    with AuditLog(db, create=False) as log:
        for prof in PROFILES:
            entries = log.entries(job_id=f"eval-{prof}")
            kinds = [e.kind for e in entries]
            assert kinds.count("round") == 1 and "model" in kinds, kinds
            created = entries[0].payload
            assert created["kind"] == "evaluate"
            assert set(created["models"]) == {"shallow", "deep"}
            assert ("dp_spend" in kinds) == (prof == "secure-dp")
            if prof != "open":
                assert contains_per_client_plaintext(log, f"eval-{prof}") == []
            result = evaluated["runs"][prof].result.to_json()
            import hashlib

            assert entries[-1].kind == "model"
            assert entries[-1].payload["digest"] == hashlib.sha256(result.encode()).hexdigest()


def test_secure_dp_metrics_are_within_the_noise_the_accountant_predicts(
        evaluated: dict[str, Any]) -> None:
    dp = evaluated["runs"]["secure-dp"].result
    exact = evaluated["runs"]["secure"].result
    assert dp.dp is not None and dp.dp["k_min"] == SITES
    spends = json.loads(json.dumps(dp.dp))
    std = spends["sum_std"]
    z = []
    for name in ("shallow", "deep"):
        for block, values in exact.model(name).sums.items():
            diff = np.asarray(dp.model(name).sums[block]) - np.asarray(values)
            z.extend((diff / std[block]).ravel().tolist())
        noisy, true = dp.model(name).metrics, exact.model(name).metrics
        assert noisy != true
        # a metric is a ratio of noisy sums (60 rows, the row count's noise std 31) and its
        # noise_std the spread of the metric re-noised around the noisy sums, so the error in
        # units of noise_std has a heavier tail than a normal's: this job run 2,300 times in
        # process gave 4,452 accuracy checks, the error above 3 noise_std in 27 and above 4 in
        # one (4.2; 600 more runs: at most 4.5; brier and log loss at most 2.1); 6 noise_std
        # is a third above the largest seen
        for metric in ("accuracy", "brier", "log_loss"):
            if noisy["n"] > 0:
                assert abs(noisy[metric] - true[metric]) <= 6 * dp.model(name).noise_std[metric]
            else:  # the noise took the row count to zero or below (3 models in 100 here)
                assert math.isnan(noisy[metric])
    z_arr = np.asarray(z)
    assert len(z_arr) > 100
    assert np.abs(z_arr).max() < 5.5
    assert 0.6 < z_arr.std() < 1.5  # the calibrated scale: noise neither absent nor larger


def test_fedforest_evaluate_creates_the_job_and_writes_the_table_and_plot_next_to_the_models(
        evaluated: dict[str, Any]) -> None:
    root = evaluated["root"]
    assert evaluated["cli_code"] == 0, evaluated["cli"]
    out = evaluated["cli"]
    assert "created" in out and "accuracy" in out and "ROC AUC" in out
    png = root / "evaluation-eval-open.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (root / "evaluation-eval-open.md").read_text()
    acc = evaluated["runs"]["open"].result.model("deep").metrics["accuracy"]
    assert f"| accuracy | deep | {acc:.4f} |" in table
    saved = json.loads((root / "evaluation-eval-open.json").read_text())
    assert saved["job_id"] == "eval-open" and len(saved["models"]) == 2
    started = [line for line in (root / "server.log").read_text().splitlines()
               if "event=job_started" in line]
    assert len(started) == len(PROFILES)
    assert all("kind=evaluate models=2" in line and "trees=" not in line for line in started)


def test_evaluate_on_an_existing_job_with_other_models_is_refused_not_answered_with_its_result(
        evaluated: dict[str, Any]) -> None:
    # eval-open scored shallow.json and deep.json: asked for deep.json alone, its result
    # (two models' metrics) must not come back as if it were that evaluation
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    root = evaluated["root"]
    args = ["evaluate", "--config", str(root / "server.toml"), "--job",
            str(root / "eval-open.toml"), "--out", str(root / "again")]
    (root / "again").mkdir()
    res = CliRunner().invoke(app, [*args, "--models", str(root / "deep.json")])
    assert res.exit_code != 0
    assert "evaluation job eval-open exists and scores other models" in " ".join(res.output.split())
    assert not any((root / "again").iterdir())
    res = CliRunner().invoke(app, [*args, "--models", str(root / "shallow.json"),
                                   str(root / "deep.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((root / "again" / "evaluation-eval-open.json").read_text())["job_id"] == \
        "eval-open"


def test_an_evaluation_clients_log_speaks_of_its_round_not_of_tree_levels(
        evaluated: dict[str, Any]) -> None:
    """An evaluation job is one round: the sites' logs name it, not "level 0 of 8" (the
    models' depth is no level of this job)."""
    logs = sorted((evaluated["root"] / "open" / "logs").glob("*.eval-open.log"))
    assert logs
    for path in logs:
        text = path.read_text()
        assert "(round 1, evaluate)" in text and " level 0 of " not in text, text
