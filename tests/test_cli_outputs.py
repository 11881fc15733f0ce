"""The commands that write a file (``schema draft --out``, ``check --clean-out``,
``audit export --out``, ``model download --out``) never replace one that is there without
``--force``, never write over their own input, and check where they write before they start."""

from __future__ import annotations

import gzip
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ports import free_port
from typer.testing import CliRunner

from fedforest_cli.audit_cli import audit_app
from fedforest_cli.cli import app
from fedforest_secure.audit import AuditLog
from fedforest_secure.pki import DevPKI
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind

runner = CliRunner()
#: the error console breaks lines at the terminal's width, which it takes from COLUMNS
WIDE = {"COLUMNS": "1000"}
#: seconds within which a command refused before it connects ends, on a loaded machine (well
#: under one on a quiet one): less than the 10 s a command that tried the server first spends
#: retrying a closed port (fedforest_cli.site_cli._transport's retry budget)
REFUSED_WITHIN = 8.0
RAW = "age,chol,num\n50,200,0\n61,250,1\n44,180,0\n70,300,1\n"


def _invoke(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args), env=WIDE)
    return res.exit_code, res.output.replace("\n", "")


def test_schema_draft_keeps_an_edited_schema(tmp_path: Path) -> None:
    data, out = tmp_path / "site.csv", tmp_path / "schema.toml"
    data.write_text(RAW)
    assert _invoke("schema", "draft", "--data", str(data), "--target", "num",
                   "--out", str(out))[0] == 0
    out.write_text(out.read_text() + "# bounds agreed with the other sites\n")
    edited = out.read_text()
    code, text = _invoke("schema", "draft", "--data", str(data), "--target", "num",
                         "--out", str(out))
    assert code == 2 and "exists" in text and "--force" in text
    assert out.read_text() == edited
    assert _invoke("schema", "draft", "--data", str(data), "--target", "num", "--out",
                   str(out), "--force")[0] == 0
    assert out.read_text() != edited


def _schema(tmp_path: Path) -> tuple[Path, Path]:
    data, schema = tmp_path / "site.csv", tmp_path / "schema.toml"
    data.write_text(RAW)
    assert _invoke("schema", "draft", "--data", str(data), "--target", "num",
                   "--out", str(schema))[0] == 0
    return data, schema


def test_check_never_writes_the_clean_rows_over_the_site_table(tmp_path: Path) -> None:
    data, schema = _schema(tmp_path)
    for force in ([], ["--force"]):
        code, text = _invoke("check", "--data", str(data), "--schema", str(schema),
                             "--clean-out", str(data), *force)
        assert code == 2 and "is the --data file" in text
        assert data.read_text() == RAW


def test_check_keeps_an_existing_clean_file_unless_forced(tmp_path: Path) -> None:
    data, schema = _schema(tmp_path)
    clean = tmp_path / "clean.csv"
    clean.write_text("yesterday's rows\n")
    code, text = _invoke("check", "--data", str(data), "--schema", str(schema),
                         "--clean-out", str(clean))
    assert code == 2 and "exists" in text
    assert clean.read_text() == "yesterday's rows\n"
    code, _ = _invoke("check", "--data", str(data), "--schema", str(schema),
                      "--clean-out", str(clean), "--force")
    assert code in (0, 1) and clean.read_text().startswith("age,chol")


def test_audit_export_keeps_an_archive_unless_forced(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with AuditLog(db) as log:
        rec = log.job("j1")
        rec.job_created(schema={}, hyperparameters={}, profile="secure")
        task = Task(job_id="j1", round_id=0, kind=TaskKind.SKETCH, level=0,
                    layout=(Block("totals", (1, 1), (StatKind.COUNT,)),))
        rec.round(task, uploads={"alice": "0" * 64}, aggregate=np.array([3.0]), masked=True)
    archive = tmp_path / "j1.jsonl.gz"
    archive.write_bytes(b"last year's archive")
    res = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl",
                                    "--out", str(archive)])
    assert res.exit_code == 2 and "exists" in res.output.replace("\n", "")
    assert archive.read_bytes() == b"last year's archive"
    res = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl",
                                    "--out", str(archive), "--force"])
    assert res.exit_code == 0, res.output
    data = archive.read_bytes()
    assert data[:2] == b"\x1f\x8b" and data[3] & 0x08  # gzip, with the original name
    assert data[10:data.index(b"\0", 10)] == b"j1.jsonl"
    assert gzip.decompress(data).count(b'"j1"') >= 2  # both entries of the job
    assert not list(tmp_path.glob(".*.part"))


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_clean_rows_are_no_more_readable_than_the_site_table_and_forced_keeps_the_mode(
        tmp_path: Path, umask_022: None) -> None:
    """A 0600 table gives a 0600 --clean-out file (not 0644, the umask's), and --force
    writing over a file the user made 0600 (or 0640) keeps that mode."""
    data, schema = _schema(tmp_path)
    data.chmod(0o600)
    clean = tmp_path / "clean.csv"
    args = ("check", "--data", str(data), "--schema", str(schema), "--clean-out", str(clean))
    assert _invoke(*args)[0] in (0, 1)
    assert _mode(clean) == 0o600
    clean.chmod(0o640)
    assert _invoke(*args, "--force")[0] in (0, 1)
    assert _mode(clean) == 0o640 and clean.read_text().startswith("age,chol")
    data.chmod(0o644)  # a table others may read gives a copy as readable
    clean.unlink()
    assert _invoke(*args)[0] in (0, 1)
    assert _mode(clean) == 0o644


@pytest.mark.parametrize("name", ["all.jsonl", "all.jsonl.gz", "all.csv"])
def test_an_audit_export_is_its_users_only_and_forced_keeps_the_mode(
        tmp_path: Path, umask_022: None, name: str) -> None:
    """The export holds the sites' disclosures: a new --out file is 0600 (as the server
    makes the audit database), and --force over a file the user made 0640 keeps 0640."""
    db = tmp_path / "audit.db"
    with AuditLog(db) as log:
        log.job("j1").job_created(schema={}, hyperparameters={}, profile="secure")
    out = tmp_path / name
    args = ["export", "--db", str(db), "--format", "csv" if name.endswith("csv") else "jsonl",
            "--out", str(out)]
    assert runner.invoke(audit_app, args).exit_code == 0
    assert _mode(out) == 0o600
    out.chmod(0o640)
    assert runner.invoke(audit_app, [*args, "--force"]).exit_code == 0
    assert _mode(out) == 0o640 and out.stat().st_size > 0


def _disk_full_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up as the written file is flushed to it."""
    import errno

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)


def test_clean_rows_that_cannot_be_written_are_one_error_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, schema = _schema(tmp_path)
    clean = tmp_path / "clean.csv"
    _disk_full_at_the_end(monkeypatch)
    res = runner.invoke(app, ["check", "--data", str(data), "--schema", str(schema),
                              "--clean-out", str(clean)], env=WIDE)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert res.stderr == (f"error: cannot write {clean}: the disk is full (No space left on "
                          "device)\n")
    assert not clean.exists() and not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize("name", ["all.jsonl", "all.jsonl.gz"])
def test_an_audit_export_that_cannot_be_written_is_one_error_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    db = tmp_path / "audit.db"
    with AuditLog(db) as log:
        log.job("j1").job_created(schema={}, hyperparameters={}, profile="secure")
    out = tmp_path / name
    _disk_full_at_the_end(monkeypatch)
    res = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl", "--out",
                                    str(out)], env=WIDE)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert res.stderr == (f"error: cannot write {out}: the disk is full (No space left on "
                          "device)\n")
    assert not out.exists() and not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize("as_url", [False, True])
def test_audit_export_never_writes_over_its_own_database(tmp_path: Path, as_url: bool) -> None:
    """``--db`` given as a path or as the SQLAlchemy URL of the same SQLite file: the export is
    refused even with --force, and the audit log is untouched."""
    db = tmp_path / "audit.db"
    with AuditLog(db) as log:
        log.job("j1").job_created(schema={}, hyperparameters={}, profile="secure")
    before = db.read_bytes()
    res = runner.invoke(audit_app, ["export", "--db", f"sqlite:///{db}" if as_url else str(db),
                                    "--format", "jsonl", "--out", str(db), "--force"], env=WIDE)
    assert res.exit_code == 2, res.output
    assert f"{db} is the --db file" in res.output.replace("\n", "")
    assert db.read_bytes() == before


def test_an_error_is_one_line_so_its_paths_copy_whole(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / "site.csv"
    res = runner.invoke(app, ["check", "--data", str(deep), "--schema", str(deep)])
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert line.startswith("error:") and str(deep) in line


def test_an_error_prints_colon_words_as_written_not_as_emoji(tmp_path: Path) -> None:
    """A fingerprint's ``AB:CD:EF`` or a file named ``:smile:`` reaches the terminal as
    written (rich would otherwise read ``:cd:`` as an emoji code)."""
    odd = tmp_path / "AB:CD:EF" / ":smile:.csv"
    res = runner.invoke(app, ["check", "--data", str(odd), "--schema", str(odd)])
    assert res.exit_code == 2
    (line,) = res.output.strip().splitlines()
    assert str(odd) in line


def _download(out: Path, ca: Path, *extra: str) -> tuple[int, str, float]:
    """``fedforest model download --out out`` from a port where no server listens: exit code,
    output, seconds taken."""
    start = time.monotonic()
    res = runner.invoke(app, ["model", "download", "--job", "j", "--out", str(out),
                              "--server", f"https://127.0.0.1:{free_port()}", "--ca", str(ca),
                              *extra], env={**WIDE, "FEDFOREST_TOKEN": "t"})
    return res.exit_code, res.output.replace("\n", ""), time.monotonic() - start


def test_model_download_keeps_an_existing_file_unless_forced(
        tmp_path: Path, dev_pki: DevPKI, monkeypatch: pytest.MonkeyPatch) -> None:
    from client_app.transport import Transport
    from fedforest_cli import site_cli

    def quick(server: str, token: str, ca: Any, cert: Any, key: Any, dev: bool) -> Transport:
        return Transport(server, token, ca, cert, key, retry_budget_s=0.5, answer_margin_s=5.0,
                         insecure_dev=dev)

    monkeypatch.setattr(site_cli, "_transport", quick)  # the closed port: given up at once
    model = tmp_path / "model.json"
    model.write_text("the model the site validated")
    code, text, _ = _download(model, dev_pki.ca_cert)
    assert code == 2 and f"{model} exists: nothing was written (--force replaces it)" in text
    assert "did not answer" not in text  # refused before connecting
    assert model.read_text() == "the model the site validated"
    code, text, _ = _download(model, dev_pki.ca_cert, "--force")
    assert code == 2 and "did not answer" in text  # --force goes on to the server
    assert model.read_text() == "the model the site validated"


def test_model_download_checks_where_it_writes_before_connecting(tmp_path: Path,
                                                                 dev_pki: DevPKI) -> None:
    missing = tmp_path / "nodir" / "m.json"
    code, text, took = _download(missing, dev_pki.ca_cert)
    assert code == 2 and f"{missing}: the directory {missing.parent} does not exist" in text
    assert ".part" not in text and took < REFUSED_WITHIN
    for force in ([], ["--force"]):
        code, text, took = _download(tmp_path, dev_pki.ca_cert, *force)
        assert code == 2 and f"{tmp_path} is a directory: name the file to write" in text
        assert took < REFUSED_WITHIN
    assert not list(tmp_path.rglob("*.part"))


def test_model_download_names_an_evaluation_result_as_such() -> None:
    """An evaluation job's download is its models' scores: the message does not call it a
    model (FedForestClassifier.load refuses it); what is neither is not written."""
    from client_app.downloads import check_result
    from fedforest_secure import FedForestClassifier
    from fedforest_secure.errors import ProtocolError
    from fedforest_secure.evaluation.result import EvalResult, ModelResult

    X = np.arange(40.0).reshape(20, 2)
    model = FedForestClassifier(n_estimators=1, max_depth=1).fit(X, np.arange(20) % 2)
    assert check_result(model.model_.to_json().encode(), None)[0] == "model"
    scores = EvalResult(job_id="ev", task="classification", contributors=2,
                        models=[ModelResult(name="m", digest="0" * 64, metrics={"auc": 0.5})])
    assert check_result(scores.to_json().encode(), None)[0] == "evaluation"
    with pytest.raises(ProtocolError, match=r"^the server's answer is not a model nor an "
                       r"evaluation result \(.*\); not written$"):
        check_result(b"not json", None)


@pytest.mark.parametrize("command", [["status"], ["prune", "--keep-days", "0"],
                                     ["rotate-token", "alice"], ["revoke-client", "alice"],
                                     ["remove-operator", "alice"]])
def test_server_commands_on_what_exists_do_not_create_a_mistyped_database(
        tmp_path: Path, command: list[str]) -> None:
    """A `database` that names no file is a typo to report, not a new empty database
    answering "no jobs yet", or "no operator 'alice'" while the real server still takes her
    leaked token."""
    config = tmp_path / "server.toml"
    config.write_text('database = "sqlite:///serevr.db"\n')
    code, out = _invoke("server", *command, "--config", str(config))
    assert code == 2 and f"no database at {tmp_path / 'serevr.db'}" in out, out
    assert not (tmp_path / "serevr.db").exists()


def test_server_status_with_a_bare_path_as_database_says_to_write_a_url(tmp_path: Path) -> None:
    """The server takes URLs only: a bare path is a malformed URL, not a missing file."""
    config = tmp_path / "server.toml"
    config.write_text('database = "server.db"\n')
    code, out = _invoke("server", "status", "--config", str(config))
    assert code == 2 and "malformed database URL" in out and "no database at" not in out, out


def test_a_downloaded_audit_line_nested_too_deeply_is_left_to_audit_verify() -> None:
    """`fedforest audit download` looks at what it wrote: a line a server nested 200,000 deep
    is passed over as any unreadable line is (`audit verify` names it), not a RecursionError
    traceback."""
    from fedforest_cli.site_cli import _holds_arrays

    nested = b"[" * 200_000 + b"\n"
    entry = b'{"seq": 1}\n'  # an entry without its arrays
    assert _holds_arrays(nested) is _holds_arrays(b"not json\n") is True
    assert _holds_arrays(nested + entry) is False
