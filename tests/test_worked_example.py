"""docs/configuration.md's worked example, end to end, as a new user runs it: four hospitals'
raw UCI files, ``schema draft``, ``check`` (every problem listed), ``pki init``, each site's
``pki request`` signed with ``pki sign``,
``server add-client``, ``create-job``, the server, four clients, ``status``,
``model download``, then ``FedForestClassifier.load`` + ``predict_proba`` on held-out rows.

The schema, server.toml and job.toml are the page's own blocks (only the port is a free one);
the commands are the page's, run through the ``fedforest`` entry point.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ports import free_port
from test_config_doc import doc_files
from test_tablecheck import site_csv
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_cli.simulate import start_server, wait_healthy
from fedforest_secure import FedForestClassifier
from fedforest_secure.audit import verify_log

pytestmark = pytest.mark.integration

SITES = {"cleveland": "cleveland", "hungary": "hungarian", "long-beach": "va",
         "zurich": "switzerland"}
#: The errors `fedforest check` finds in each raw file against the page's schema: every column
#: of the schema with a '?' (and, at Long Beach, the out-of-bounds trestbps = 0).
RAW_ERRORS = {"cleveland": set(), "hungary": {"trestbps", "chol", "fbs", "restecg", "thalach",
                                              "exang"},
              "long-beach": {"trestbps", "chol", "fbs", "thalach", "exang", "oldpeak"},
              "zurich": {"trestbps", "fbs", "restecg", "thalach", "exang", "oldpeak"}}


def run(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    if res.exit_code != 0:
        raise AssertionError(f"fedforest {' '.join(args)} -> {res.exit_code}\n{res.output}")
    return res.output


def split_held_out(clean: Path, held: Path) -> None:
    """Every fifth row of a site's clean table is kept back for the prediction at the end."""
    with clean.open(newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    for path, part in ((clean, [r for i, r in enumerate(body) if i % 5]),
                       (held, [r for i, r in enumerate(body) if not i % 5])):
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows([header, *part])


def _wait_for(log: Path, text: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"{log} never said {text!r}:\n{log.read_text()}")


def test_the_worked_example_from_raw_files_to_predict_proba(tmp_path: Path) -> None:
    files = doc_files()
    root = tmp_path
    # 1. each site adds a header row to its raw file
    for site, center in SITES.items():
        (root / site).mkdir()
        site_csv(root / site, center).rename(root / site / "site.csv")
    # 2. a draft schema from one site; the federation's schema is the page's
    run("schema", "draft", "--data", str(root / "cleveland" / "site.csv"), "--target", "num",
        "--out", str(root / "schema-draft.toml"))
    assert "BOUNDS MUST BE PUBLIC" in (root / "schema-draft.toml").read_text()
    (root / "schema.toml").write_text(files["schema.toml"])
    schema = str(root / "schema.toml")
    # 3. each site checks its raw table (every problem listed), cleans it, checks again
    runner = CliRunner()
    for site in SITES:
        data = str(root / site / "site.csv")
        res = runner.invoke(app, ["check", "--data", data, "--schema", schema])
        flagged = set(re.findall(r"error   column '(\w+)': \d+ missing", res.output))
        assert flagged == RAW_ERRORS[site], res.output
        assert res.exit_code == (1 if RAW_ERRORS[site] or site == "long-beach" else 0)
        extra = ["--zero-is-missing", "chol,trestbps"] if site == "long-beach" else []
        runner.invoke(app, ["check", "--data", data, "--schema", schema, *extra,
                            "--clean-out", str(root / site / "clean.csv")])
        run("check", "--data", str(root / site / "clean.csv"), "--schema", schema)
        split_held_out(root / site / "clean.csv", root / site / "held-out.csv")
    long_beach = runner.invoke(app, ["check", "--data", str(root / "long-beach" / "site.csv"),
                                     "--schema", schema]).output
    assert "49 zeros at lines 7, 9, 10" in long_beach and "hidden missing values?" in long_beach
    assert "classes 2, 3, 4 of the schema never occur" in runner.invoke(app, [
        "check", "--data", str(root / "hungary" / "site.csv"), "--schema", schema]).output
    # 4. the CA apart from the server's files; each site's own key, its request signed
    run("pki", "init", "--out", str(root / "ca"), "--host", "127.0.0.1")
    (root / "certs").mkdir(mode=0o700)
    for part in ("server.pem", "server.key"):
        (root / "ca" / part).rename(root / "certs" / part)
    (root / "certs" / "ca.pem").write_bytes((root / "ca" / "ca.pem").read_bytes())
    for site in SITES:
        run("pki", "request", "--name", site, "--out", str(root / "certs"))
        run("pki", "sign", "--csr", str(root / "certs" / f"{site}.csr"), "--ca-dir",
            str(root / "ca"))
        (root / "certs" / f"{site}.pem").write_bytes((root / "ca" / f"{site}.pem").read_bytes())
    # the coordinator's side holds no site's key
    assert sorted(p.name for p in (root / "ca").glob("*.key*")) == ["ca.key"]
    # server.toml, job.toml, sites, the job
    port = free_port()
    (root / "server.toml").write_text(files["server.toml"].replace("port = 8443",
                                                                    f"port = {port}"))
    (root / "job.toml").write_text(files["job.toml"])
    config = str(root / "server.toml")
    tokens = {site: run("server", "add-client", site, "--config", config).strip()
              .splitlines()[-1] for site in SITES}
    assert all(t.startswith("ffs_") for t in tokens.values())
    out = run("server", "create-job", "--config", config, "--job", str(root / "job.toml"))
    assert "job heart-2024 created for 4 clients" in out
    # 5. the server and each site's client (the page's command line)
    url = f"https://127.0.0.1:{port}"
    certs = root / "certs"
    server = start_server(root / "server.toml", root / "server.log")
    clients: list[subprocess.Popen[bytes]] = []
    try:
        wait_healthy(url, certs / "ca.pem", server, cert=certs / "zurich.pem",
                     key=certs / "zurich.key")
        for site in SITES:
            env = {**os.environ, "FEDFOREST_TOKEN": tokens[site],
                   "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            with (root / site / "client.log").open("wb") as log:
                clients.append(subprocess.Popen(
                    [sys.executable, "-m", "fedforest_cli", "client", "--server", url,
                     "--job", "heart-2024", "--ca", str(certs / "ca.pem"),
                     "--cert", str(certs / f"{site}.pem"), "--key", str(certs / f"{site}.key"),
                     "--data", str(root / site / "clean.csv"), "--schema", schema,
                     "--profile", "secure", "--state-dir", str(root / site / "state"),
                     "--out", str(root / site / "model.json")],
                    stdout=log, stderr=subprocess.STDOUT, env=env))
            if site == "cleveland":  # the first site waits for the others, and says so
                _wait_for(root / site / "client.log", "waiting for sites hungary, long-beach "
                                                      "and zurich to join")
        site_opts = ["--server", url, "--ca", str(certs / "ca.pem"), "--cert",
                     str(certs / "zurich.pem"), "--key", str(certs / "zurich.key")]
        os.environ["FEDFOREST_TOKEN"] = tokens["zurich"]
        try:
            during = run("status", "--job", "heart-2024", *site_opts)
            codes = [c.wait(300) for c in clients]
            after = run("status", "--job", "heart-2024", *site_opts)
            listed = run("jobs", *site_opts)
            downloaded = run("model", "download", "--job", "heart-2024", "--out",
                             str(root / "model.json"), *site_opts)
            # a second download keeps the file unless --force
            (root / "model.json").write_text("a site's own notes")
            again = CliRunner().invoke(app, ["model", "download", "--job", "heart-2024",
                                             "--out", str(root / "model.json"), *site_opts])
            kept = (root / "model.json").read_text()
            run("model", "download", "--job", "heart-2024", "--out", str(root / "model.json"),
                "--force", *site_opts)
            # 7. a site fetches its job's log and checks it against its own receipts
            fetched = run("audit", "download", "--job", "heart-2024", "--out",
                          str(root / "heart.jsonl"), *site_opts)
            site_check = run("audit", "verify", "--db", str(root / "heart.jsonl"), "--receipts",
                             str(root / "zurich" / "state" / "receipts"), "--job", "heart-2024")
            run("audit", "download", "--job", "heart-2024", "--out",
                str(root / "heart.jsonl.gz"), *site_opts)  # compressed, as export writes it
            gz_check = run("audit", "verify", "--db", str(root / "heart.jsonl.gz"), "--job",
                           "heart-2024")
        finally:
            del os.environ["FEDFOREST_TOKEN"]
        operator = run("server", "status", "--config", config)
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait()
        server.terminate()
        server.wait(30)
    logs = {site: (root / site / "client.log").read_text() for site in SITES}
    assert codes == [0, 0, 0, 0], logs
    assert re.search(r"members: \d of 4 joined", during) and "(you)" in during
    assert "job heart-2024: done" in after and "members: 4 of 4 joined, 4 active, 0 dropped" \
        in after
    assert re.search(r"heart-2024 +done +3  active", listed)  # zurich is site 3
    assert operator.splitlines()[0].split()[:4] == ["JOB", "STATUS", "ROUND", "LEVEL"]
    # plain log lines off a terminal: each level (and the first site waited for the others)
    assert all("fedforest-client job heart-2024: level 0 of 3" in text for text in logs.values())
    server_log = (root / "server.log").read_text()
    assert "event=startup" in server_log and server_log.count("event=join ") == 4
    assert "event=job_done job=heart-2024" in server_log and "Traceback" not in server_log
    assert again.exit_code == 2 and "exists" in again.output and kept == "a site's own notes"
    assert re.search(r"OK: \d+ entries in 1 job\(s\), [1-9]\d* receipt\(s\) checked", site_check)
    # the site's copy holds no arrays (the server keeps them for its operator): a note says
    # what was not checked, and the chain and receipts verify on the digests
    assert gz_check.splitlines()[-1].startswith("OK: "), gz_check
    assert "are not in this log, as the server serves its sites the log" in site_check
    assert re.search(r"entries; without the rounds' arrays, which the server keeps for its "
                     r"operator: their digests are in the chain", fetched), fetched
    # off a terminal the line is not wrapped: the path and the digest copy whole
    assert re.search(r"written to \S+model\.json \(sha256 [0-9a-f]{64}\)", downloaded), \
        downloaded
    # 6. the downloaded model is every client's --out, and the estimators read it
    model_bytes = (root / "model.json").read_bytes()
    assert all((root / site / "model.json").read_bytes() == model_bytes for site in SITES)
    model = FedForestClassifier.load(root / "model.json")
    assert list(model.classes_) == ["0", "1", "2", "3", "4"]
    held = pd.concat([pd.read_csv(root / site / "held-out.csv") for site in SITES])
    truth = held.pop("num").to_numpy()
    shuffled = held[list(reversed(held.columns))]  # columns by name, in any order
    proba = model.predict_proba(shuffled)
    assert proba.shape == (len(held), 5)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(proba, model.predict_proba(held))
    healthy = proba[:, 0]  # P(num = 0)
    assert healthy[truth == 0].mean() > healthy[truth > 0].mean() + 0.05
    # the audit log verifies against every site's receipts
    receipts = root / "receipts"
    receipts.mkdir()
    for site in SITES:
        for path in (root / site / "state" / "receipts").glob("*.jsonl"):
            (receipts / path.name).write_bytes(path.read_bytes())
    report = verify_log(root / "audit.db", receipts_dir=receipts)
    assert report.ok, report.problems
