"""The operator page /ui: read-only, behind an operator token; and in a real headless browser
(Debian's chromium), a running job's members and level, without console errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request  # at the top: the API's route names it in a string

from fedforest_cli.simulate import write_server_config
from server_app.app import create_app
from server_app.audit_hook import NullAudit, open_audit
from server_app.auth import add_client, add_operator, remove_operator
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def browser() -> tuple[str, str]:
    """Debian's chromium and its driver on PATH, or a skip naming what is missing and how
    to install it."""
    found = {name: shutil.which(name) for name in ("chromium", "chromedriver")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(f"no {' or '.join(missing)} on PATH: the browser test of /ui needs "
                    "Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/install-browser does so as root)")
    return str(found["chromium"]), str(found["chromedriver"])


@pytest.fixture()
def ui(tmp_path: Path, tiny_parts, job_dir) -> Iterator[dict]:
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    operator = add_operator(db, "ops")
    audit = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_toml))
    with TestClient(create_app(db, audit, state=state, tick_seconds=60)) as http:
        yield {"http": http, "tokens": tokens, "operator": operator}
    db.dispose()


def test_the_page_needs_no_token_and_holds_no_data(ui: dict) -> None:
    r = ui["http"].get("/ui")
    assert r.status_code == 200 and "Operator token" in r.text and "client-0" not in r.text
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert ui["http"].get("/ui/app.js").headers["content-type"].startswith("text/javascript")


def test_no_page_but_the_operators_runs_scripts_in_its_origin(ui: dict) -> None:
    """FastAPI's /docs and /redoc would load a CDN's scripts where the token is kept."""
    http = ui["http"]
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert http.get(path).status_code == 404, path
    r = http.get("/openapi.json")
    assert r.headers["content-type"] == "application/json" and "paths" in r.json()


def test_the_jobs_api_needs_an_operator_token_not_a_client_one(ui: dict) -> None:
    http = ui["http"]
    assert http.get("/ui/api/jobs").status_code == 401
    client = {"Authorization": f"Bearer {ui['tokens'][0]}"}
    assert http.get("/ui/api/jobs", headers=client).status_code == 401
    forged = ui["operator"][:-4] + "AAAA"
    assert http.get("/ui/api/jobs", headers={"Authorization": f"Bearer {forged}"}
                    ).status_code == 401
    # an operator token is no client token either
    op = {"Authorization": f"Bearer {ui['operator']}"}
    assert http.get("/v1/jobs", headers=op).status_code == 401
    http.post("/v1/jobs/job-a/join", headers=client)
    body = http.get("/ui/api/jobs", headers=op).json()
    (job,) = body["jobs"]
    assert job["job_id"] == "job-a" and job["status"] == "waiting"
    assert [(m["name"], m["state"]) for m in job["members"]] == [
        ("client-0", "active"), ("client-1", "invited"), ("client-2", "invited")]
    assert job["audit"]["ok"] is True and job["audit"]["entries"] == 2  # created, joined


def test_the_page_shows_an_audit_chain_changed_under_a_running_server(
        ui: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry rewritten in the audit database (not appended: the chain's tip stays) shows
    as "does not verify" once the page's result is older than the recheck interval."""
    import sqlite3

    import server_app.ui as ui_mod

    op = {"Authorization": f"Bearer {ui['operator']}"}
    http = ui["http"]
    http.post("/v1/jobs/job-a/join", headers={"Authorization": f"Bearer {ui['tokens'][0]}"})
    assert http.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]["ok"] is True
    with sqlite3.connect(tmp_path / "audit.db") as conn:
        conn.execute("UPDATE audit_entries SET payload = replace(payload, 'client-0', "
                     "'client-9') WHERE kind = 'client_joined'")
    monkeypatch.setattr(ui_mod, "RECHECK_S", 0.0)
    audit = http.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]
    assert audit["ok"] is False and "changed" in "; ".join(audit["problems"])


@pytest.mark.parametrize(("change", "problem"), [
    ("seq = 'x2'", "row 2 of the audit log (job 'job-a') has seq 'x2', not an integer: the "
                   "audit database was changed behind the log's back"),
    ("payload = CAST(X'7B22FF227D' AS TEXT)",
     "the audit log's entries cannot be read (OperationalError: Could not decode to UTF-8 "
     "column 'payload'"),
])
def test_the_page_shows_a_row_changed_to_what_the_log_never_writes_as_not_verifying(
        ui: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str,
        problem: str) -> None:
    """A value SQLite keeps behind the log's back (text for a seq, text that is not UTF-8):
    the page's chain check names it, on the running server and on one that starts now (whose
    read of the chain's tip fails too)."""
    import sqlite3

    import server_app.ui as ui_mod

    monkeypatch.setattr(ui_mod, "RECHECK_S", 0.0)
    op = {"Authorization": f"Bearer {ui['operator']}"}
    http = ui["http"]
    http.post("/v1/jobs/job-a/join", headers={"Authorization": f"Bearer {ui['tokens'][0]}"})
    assert http.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]["ok"] is True
    with sqlite3.connect(tmp_path / "audit.db") as conn:  # the join's entry, seq 2
        conn.execute(f"UPDATE audit_entries SET {change} WHERE kind = 'client_joined'")
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    fresh = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    with TestClient(create_app(db, fresh, state=ServerState(db, fresh),
                               tick_seconds=60)) as http2:
        for client in (http, http2):
            r = client.get("/ui/api/jobs", headers=op)
            assert r.status_code == 200, r.text
            audit = r.json()["jobs"][0]["audit"]
            assert audit["ok"] is False and audit["entries"] == 0
            assert audit["problems"][0].startswith(problem), audit["problems"]
    db.dispose()


def test_the_page_shows_a_chain_cut_deleted_or_missing_as_not_verifying(
        ui: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain sound in itself is still wrong when entries after the tip this server wrote are
    gone, when a job that began with an audit log has no entry in the log the server uses
    (a mistyped audit_database), or when a finished job's model entry is missing."""
    import sqlite3

    import server_app.ui as ui_mod

    monkeypatch.setattr(ui_mod, "RECHECK_S", 0.0)
    op = {"Authorization": f"Bearer {ui['operator']}"}
    http = ui["http"]
    http.post("/v1/jobs/job-a/join", headers={"Authorization": f"Bearer {ui['tokens'][0]}"})
    assert http.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]["ok"] is True
    with sqlite3.connect(tmp_path / "audit.db") as conn:  # the join's entry, the chain's end
        conn.execute("DELETE FROM audit_entries WHERE kind = 'client_joined'")
    audit = http.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]
    assert audit["ok"] is False and audit["entries"] == 1
    assert "the chain ends at seq 1, not with the entry this server last wrote" in \
        audit["problems"][0]
    # another server on this database, with an empty audit log (a mistyped path)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    other = open_audit(f"sqlite:///{tmp_path / 'other-audit.db'}")
    with TestClient(create_app(db, other, state=ServerState(db, other),
                               tick_seconds=60)) as http2:
        audit = http2.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]
        assert audit["ok"] is False and audit["entries"] == 0
        assert "holds no entry of this job, which began with one" in audit["problems"][0]
    # a finished job whose model entry is not in the chain (seen by a server that starts now)
    with sqlite3.connect(tmp_path / "server.db") as conn:
        conn.execute("UPDATE jobs SET status = 'done', model_digest = :d", {"d": "ab" * 32})
    fresh = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    with TestClient(create_app(db, fresh, state=ServerState(db, fresh),
                               tick_seconds=60)) as http3:
        audit = http3.get("/ui/api/jobs", headers=op).json()["jobs"][0]["audit"]
        assert audit["ok"] is False
        assert "no model entry for the job's model" in "; ".join(audit["problems"])
    db.dispose()


def test_a_server_without_an_audit_log_shows_none_kept_not_a_broken_chain(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    operator = add_operator(db, "ops")
    for k in range(3):
        add_client(db, f"client-{k}")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        body = http.get("/ui/api/jobs", headers={"Authorization": f"Bearer {operator}"}).json()
    db.dispose()
    assert body["jobs"][0]["audit"] == {"kept": False, "ok": None, "entries": 0,
                                        "problems": []}


# ---------------------------------------------------------------------- the real browser
def _driver():  # type: ignore[no-untyped-def]
    chromium, chromedriver = browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    opts.accept_insecure_certs = True  # the federation's dev CA is not in the browser's store
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


@pytest.mark.integration
def test_a_browser_sees_a_running_jobs_members_and_level_without_console_errors(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    from test_integration_https import launch_client, launch_server, setup_fed, stop

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=120.0)
    # the page is opened without a client certificate: this server does not ask for one
    write_server_config(fed.root, int(fed.url.rsplit(":", 1)[1]), fed.certs, mtls=False)
    db = Database(f"sqlite:///{fed.root / 'server.db'}")
    operator = add_operator(db, "ops")
    db.dispose()
    driver = _driver()
    server = launch_server(fed)
    clients = [launch_client(fed, k) for k in range(3)]
    try:
        _wait_running(fed.root / "server.log")
        os.kill(clients[2].pid, signal.SIGSTOP)  # the job waits for it: running, mid-level
        driver.get(fed.url + "/ui")
        driver.find_element(By.ID, "token").send_keys(operator)
        driver.find_element(By.ID, "show").click()
        wait = WebDriverWait(driver, 30)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'section[data-job="job-a"]')))
        job = driver.find_element(By.CSS_SELECTOR, 'section[data-job="job-a"]')
        assert job.find_element(By.CSS_SELECTOR, ".status").text == "running"
        members = {r.get_attribute("data-member"): r.text for r in
                   job.find_elements(By.CSS_SELECTOR, "tr.member")}
        assert set(members) == {"client-0", "client-1", "client-2"}
        assert all("active" in t for t in members.values())
        level = job.find_element(By.CSS_SELECTOR, 'tr[data-fact="level"] td').text
        assert level.endswith("of 3") and level.split()[0].isdigit()
        audit = job.find_element(By.CSS_SELECTOR, 'tr[data-fact="audit"] td').text
        assert audit.startswith("verifies (")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], json.dumps(errors)
        # the operator is removed (a leaked token): the next refresh is refused and the page
        # no longer shows what it showed
        db = Database(f"sqlite:///{fed.root / 'server.db'}")
        remove_operator(db, "ops")
        db.dispose()
        wait.until(ec.text_to_be_present_in_element((By.ID, "message"),
                                                    "unknown operator token"))
        assert driver.find_elements(By.CSS_SELECTOR, "section.job") == []
    finally:
        driver.quit()
        if clients[2].poll() is None:
            os.kill(clients[2].pid, signal.SIGCONT)
        for c in clients:
            stop(c)
        stop(server)


def _wait_running(server_log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = server_log.read_text() if server_log.exists() else ""
        if "event=round " in text:  # a round closed: the job is running
            return
        time.sleep(0.1)
    raise AssertionError(f"the job did not start: {server_log.read_text()}")


def test_the_browser_test_is_not_skipped_where_chromium_is_installed() -> None:
    """Where chromium is on PATH (CI installs it: .ci/install-browser) its driver is too and
    the browser starts, so the browser test runs rather than skips."""
    if shutil.which("chromium") is None:
        pytest.skip("no chromium on this machine")
    chromium, chromedriver = browser()
    assert subprocess.run([chromium, "--version"], capture_output=True, timeout=60
                          ).returncode == 0
    assert subprocess.run([chromedriver, "--version"], capture_output=True, timeout=60
                          ).returncode == 0


def test_without_chromium_the_browser_test_skips_saying_what_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match=r"no chromium or chromedriver on PATH.*"
                                                    r"apt-get install chromium chromium-driver"):
        browser()
    (tmp_path / "chromium").write_text("#!/bin/sh\n")
    (tmp_path / "chromium").chmod(0o755)
    with pytest.raises(pytest.skip.Exception, match=r"no chromedriver on PATH"):
        browser()


# ---------------------------------------------------------------------- CI's browser install
INSTALL = Path(__file__).resolve().parents[1] / ".ci" / "install-browser"


def _install(tmp_path: Path, uid: int, apt_rc: int | None, browser_there: bool = False
             ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run .ci/install-browser with stand-ins on PATH: ``id`` reports ``uid``, ``apt-get``
    (absent when ``apt_rc`` is None) records its arguments and exits ``apt_rc``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    stubs = {"id": f"echo {uid}"}
    if apt_rc is not None:
        stubs["apt-get"] = f'echo "$*" >> {calls}\nexit {apt_rc}'
    if browser_there:
        stubs.update(chromium="exit 0", chromedriver="exit 0")
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    res = subprocess.run([bash, str(INSTALL)], env={"PATH": str(bin_dir)}, capture_output=True,
                         text=True, timeout=60)
    return res, calls.read_text().splitlines() if calls.exists() else []


def test_ci_installs_chromium_with_apt_get_as_root_when_it_is_missing(tmp_path: Path) -> None:
    res, calls = _install(tmp_path, uid=0, apt_rc=0)
    assert res.returncode == 0, res.stderr
    assert calls == ["update -qq", "install -y -qq chromium chromium-driver"]


def test_ci_leaves_an_installed_chromium_alone(tmp_path: Path) -> None:
    res, calls = _install(tmp_path, uid=0, apt_rc=0, browser_there=True)
    assert (res.returncode, calls, res.stderr) == (0, [], "")


@pytest.mark.parametrize(("uid", "apt_rc", "says"), [
    (1000, 0, "needs root and apt-get"),    # not root: apt-get is never asked
    (0, None, "needs root and apt-get"),    # not a Debian machine
    (0, 100, "apt-get could not install"),  # root, but the archive is out of reach
])
def test_ci_goes_on_and_says_so_when_chromium_cannot_be_installed(
        tmp_path: Path, uid: int, apt_rc: int | None, says: str) -> None:
    res, calls = _install(tmp_path, uid=uid, apt_rc=apt_rc)
    assert res.returncode == 0, "a missing browser must not fail the CI run"
    assert says in res.stderr and "the browser test of /ui will be skipped" in res.stderr
    assert calls == ([] if uid else ["update -qq"] if apt_rc else [])


def test_ci_runs_the_browser_install_before_the_tests() -> None:
    steps = [ln.strip() for ln in (INSTALL.parent / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert steps.index(".ci/install-browser") < steps.index("make test")


@contextmanager
def _page_with_api(answers: Iterator[Any], *, script: Callable[[str], str] = str,
                   asked: list[str] | None = None) -> Iterator[tuple[Any, int]]:
    """The real page and script (``script`` of its text) in a headless browser, served with an
    API that gives ``answers`` in turn (then a non-JSON 502 from something in between), each
    request's Authorization header appended to ``asked``: ``(driver, port)``."""
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse, Response

    from fedforest_cli.sim_processes import free_port
    from server_app.ui import _static

    app = FastAPI()
    app.get("/ui")(lambda: _static("index.html"))
    app.get("/ui/app.css")(lambda: _static("app.css"))

    @app.get("/ui/app.js")
    def app_js() -> Response:
        page = _static("app.js")
        return Response(content=script(bytes(page.body).decode()), media_type=page.media_type,
                        headers={k: v for k, v in page.headers.items()
                                 if k not in ("content-length", "content-type")})

    @app.get("/ui/api/jobs")
    def jobs(request: Request) -> Response:
        if asked is not None:
            asked.append(request.headers.get("authorization", ""))
        return next(answers, PlainTextResponse("<html>bad gateway</html>", status_code=502))

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    driver = _driver()
    try:
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(driver, 30).until(lambda _: server.started)
        yield driver, port
    finally:
        driver.quit()
        server.should_exit = True
        thread.join(10)


RUNNING_JOB = {"job_id": "job-a", "status": "running", "kind": "train", "profile": "secure",
               "level": 1, "max_depth": 3, "round_id": 2, "phase": "upload", "rounds_done": 1,
               "joined_clients": 3, "n_clients": 3, "active_clients": 3, "dropped_clients": 0,
               "min_clients": 3, "eta_s": 12.0, "reason": "", "members": [],
               "audit": {"kept": True, "ok": True, "entries": 5, "problems": []}}


@pytest.mark.integration
def test_a_browser_keeps_the_last_jobs_and_says_the_server_failed_on_an_error_answer(
        tmp_path: Path) -> None:
    """The real page and script, served with an API that answers once and then fails (a 500
    with the server's JSON detail, then a non-JSON 502 from something in between): the page
    keeps the jobs it showed and says the server failed and why, without a console error."""
    from fastapi.responses import JSONResponse
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    answers = iter([JSONResponse({"version": "x", "jobs": [RUNNING_JOB]}),
                    JSONResponse({"error": "server_error", "detail": "the server's database "
                                  "failed"}, status_code=500)])
    with _page_with_api(answers) as (driver, port):
        driver.get(f"http://127.0.0.1:{port}/ui")
        driver.find_element(By.ID, "token").send_keys("ffo_x")
        driver.find_element(By.ID, "show").click()
        message = driver.find_element(By.ID, "message")
        WebDriverWait(driver, 30).until(
            lambda _: "the server's database failed" in message.text)
        assert "the server failed (the server's database failed); the jobs below are from " \
               "the last answer" == message.text
        assert driver.find_element(By.CSS_SELECTOR, 'section[data-job="job-a"]')
        WebDriverWait(driver, 30).until(lambda _: "HTTP 502" in message.text)
        assert driver.find_element(By.CSS_SELECTOR, 'section[data-job="job-a"]')
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
                  and "/ui/api/jobs" not in e["message"]]  # the failed fetches themselves
        assert errors == [], errors


@pytest.mark.integration
def test_a_browser_shows_a_stalled_level_as_overrun_with_the_phase_deadline_not_an_eta(
        tmp_path: Path) -> None:
    """A level a site stalls: the page says how long it overran and when the open phase's
    deadline drops the sites that have not answered, not "about 1 s"; an on-time level shows
    its ETA and no deadline."""
    from fastapi.responses import JSONResponse
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    stalled = {**RUNNING_JOB, "job_id": "job-s", "eta_s": None, "overrun_s": 40.2,
               "deadline_in_s": 19.6}
    on_time = {**RUNNING_JOB, "deadline_in_s": 50.0}
    answers = iter([JSONResponse({"version": "x", "jobs": [stalled, on_time]})] * 100)
    with _page_with_api(answers) as (driver, port):
        driver.get(f"http://127.0.0.1:{port}/ui")
        driver.find_element(By.ID, "token").send_keys("ffo_x")
        driver.find_element(By.ID, "show").click()
        WebDriverWait(driver, 30).until(
            lambda _: driver.find_elements(By.CSS_SELECTOR, 'section[data-job="job-s"]'))

        def fact(job: str, name: str) -> list[str]:
            return [e.text for e in driver.find_elements(
                By.CSS_SELECTOR, f'section[data-job="{job}"] tr[data-fact="{name}"] td')]

        assert fact("job-s", "ETA") == [
            "none while level 1 waits: it has run 40 s longer than the levels before it took "
            "each"]
        assert fact("job-s", "deadline") == [
            "phase upload closes in about 20 s at the latest; the sites that have not "
            "answered it by then are dropped"]
        assert fact("job-a", "ETA") == ["about 12 s"] and fact("job-a", "deadline") == []
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors


@pytest.mark.integration
def test_a_browser_marks_a_revoked_member_a_waiting_job_waits_for(tmp_path: Path) -> None:
    """The /ui job list's ``revoked`` member: the page says it cannot join and what lets it."""
    from fastapi.responses import JSONResponse
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = {**RUNNING_JOB, "status": "waiting", "round_id": -1, "level": None,
               "phase": None, "members": [
                   {"name": "client-0", "index": 0, "state": "active", "revoked": False},
                   {"name": "client-1", "index": 1, "state": "invited", "revoked": True}]}
    answers = iter([JSONResponse({"version": "x", "jobs": [waiting]})] * 100)
    with _page_with_api(answers) as (driver, port):
        driver.get(f"http://127.0.0.1:{port}/ui")
        driver.find_element(By.ID, "token").send_keys("ffo_x")
        driver.find_element(By.ID, "show").click()
        WebDriverWait(driver, 30).until(
            lambda _: driver.find_elements(By.CSS_SELECTOR, "tr.member"))
        states = {r.get_attribute("data-member"): r.find_elements(By.TAG_NAME, "td")[2].text
                  for r in driver.find_elements(By.CSS_SELECTOR, "tr.member")}
        assert states == {"client-0": "active", "client-1": "invited (revoked: it cannot join "
                          "until `fedforest server rotate-token client-1`)"}
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors


@pytest.mark.integration
def test_the_operators_certificate_opens_the_page_of_a_server_that_asks_for_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real server with ``client_ca`` (it asks every connection for a certificate of the
    federation CA): the operator's certificate issued as docs/deployment.md §5 says, taken
    from its .p12 as a browser imports it, opens /ui and, with an operator token, its jobs API;
    a connection without a certificate fails its handshake."""
    import ssl

    import httpx
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12
    from test_integration_https import provision, stop
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_secure.pki import is_operator_certificate
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    server = provision(tmp_path, ["client-0"], [])
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    res = CliRunner().invoke(app, ["pki", "issue", "--ca-dir", str(server.certs), "--name",
                                   "operator", "--operator", "--p12"])
    assert res.exit_code == 0, res.output
    key, cert, _ = pkcs12.load_key_and_certificates(
        (server.certs / "operator.p12").read_bytes(), b"pw")
    assert key is not None and cert is not None and is_operator_certificate(cert)
    (tmp_path / "browser.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "browser.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    with ServerAdmin.from_settings(load_settings(server.toml)) as admin:
        operator = admin.add_operator("ops")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.launch(tmp_path / "server.log", procs)
        ca = str(server.certs / "ca.pem")
        browser = ssl.create_default_context(cafile=ca)
        browser.load_cert_chain(str(tmp_path / "browser.pem"), str(tmp_path / "browser.key"))
        with httpx.Client(base_url=server.url, verify=browser, timeout=10) as http:
            page = http.get("/ui")
            assert page.status_code == 200 and "Operator token" in page.text
            jobs = http.get("/ui/api/jobs", headers={"Authorization": f"Bearer {operator}"})
            assert jobs.status_code == 200, jobs.text
            assert jobs.json()["jobs"] == []
        with (httpx.Client(base_url=server.url, verify=ssl.create_default_context(cafile=ca),
                           timeout=10) as http, pytest.raises(httpx.HTTPError)):
            http.get("/ui")
    finally:
        for proc in procs:
            stop(proc)
