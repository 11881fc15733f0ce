"""Models, results and keys are written whole or not at all."""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import typer
from other_user import NOBODY, as_other_user, shared_folder

from client_app.state import ClientState
from fedforest_secure import FedForestClassifier, files
from fedforest_secure.files import write_atomic

__all__ = ["shared_folder"]  # the fixture, imported for the tests below


def _crash_halfway(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process dies (here: an error) after half of the new bytes are on disk."""
    def half(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(files, "_write_all", half)


def test_a_crash_while_writing_leaves_the_old_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "result.json"
    write_atomic(path, '{"old": true}')
    _crash_halfway(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, '{"new": "x"}' * 1000)
    assert path.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_modes_follow_the_umask_or_the_secret_mode(tmp_path: Path) -> None:
    write_atomic(tmp_path / "model.json", b"{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "model.json").stat().st_mode) == 0o666 & ~umask
    write_atomic(tmp_path / "key", b"k", mode=0o600)
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600


def test_a_file_replaced_with_keep_mode_keeps_its_mode_and_is_never_more_open(
        tmp_path: Path) -> None:
    """Under umask 000 too: the new file takes the old one's mode (0600 stays 0600, 0640
    stays 0640, a read-only 0444 stays 0444), and a missing one is made with ``mode``. While
    the block writes it the temporary file is its owner's only, and writable by it."""
    path = tmp_path / "out.csv"
    seen: list[int] = []
    old = os.umask(0)
    try:
        for mode in (0o600, 0o640, 0o444):
            path.write_text("old")
            path.chmod(mode)
            with files.replacing(path, keep_mode=True) as tmp:
                seen.append(stat.S_IMODE(tmp.stat().st_mode))
                tmp.write_text("new")
            assert stat.S_IMODE(path.stat().st_mode) == mode and path.read_text() == "new"
        path.chmod(0o600)
        path.unlink()
        with files.replacing(path, mode=0o600, keep_mode=True) as tmp:
            tmp.write_text("new")
    finally:
        os.umask(old)
    assert seen == [0o600, 0o600, 0o600]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_read_only_mode_is_given_once_the_file_is_written(tmp_path: Path) -> None:
    """``mode=0o444`` (a copy of a read-only table): the temporary file is writable by its
    owner while the block writes it (group and others have what ``mode`` gives them); the
    file ends up 0444 less the umask."""
    path = tmp_path / "clean.csv"
    old = os.umask(0o022)
    try:
        with files.replacing(path, mode=0o444) as tmp:
            made = stat.S_IMODE(tmp.stat().st_mode)
            tmp.write_text("new")
        assert made == 0o644 and stat.S_IMODE(path.stat().st_mode) == 0o444
        os.umask(0o077)
        path.unlink()
        with files.replacing(path, mode=0o444) as tmp:
            tmp.write_text("new")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o400 and path.read_text() == "new"


def test_a_user_who_is_not_root_writes_read_only_copies_and_replaces_read_only_files(
        shared_folder: Path) -> None:
    """As a user without root's right to write any file (the other user plays it): a new
    file of mode 0444 or 0440, and one that replaces a 0444 file keeping its mode, are
    written, not refused with "Permission denied"."""
    script = (
        "import importlib.util, os, stat, sys\n"
        "spec = importlib.util.spec_from_file_location('files', sys.argv[1])\n"
        "files = importlib.util.module_from_spec(spec); spec.loader.exec_module(files)\n"
        "folder = sys.argv[2]; os.umask(0o022); modes = []\n"
        "for mode in (0o444, 0o440):\n"
        "    path = os.path.join(folder, f'new-{mode:o}.csv')\n"
        "    with files.replacing(path, mode=mode) as tmp:\n"
        "        tmp.write_text('new')\n"
        "    modes.append(stat.S_IMODE(os.stat(path).st_mode))\n"
        "path = os.path.join(folder, 'old.csv')\n"
        "open(path, 'w').write('old'); os.chmod(path, 0o444)\n"
        "with files.replacing(path, keep_mode=True) as tmp:\n"
        "    tmp.write_text('new')\n"
        "modes.append(stat.S_IMODE(os.stat(path).st_mode))\n"
        "assert open(path).read() == 'new', 'not replaced'\n"
        "open(os.path.join(folder, 'modes'), 'w').write(repr(modes))\n")
    as_other_user("python3", "-c", script, files.__file__, str(shared_folder))
    assert (shared_folder / "modes").read_text() == "[292, 288, 292]"  # 0444, 0440, 0444
    assert not list(shared_folder.glob(".*.part"))


def test_a_replaced_file_keeps_its_group_or_gives_the_new_group_nothing(
        shared_folder: Path) -> None:
    """An archive made 0640 for a group: replaced by a user who may give files that group
    (root here), it keeps group and mode; replaced by one who may not (the other user, not in
    that group), the new file's group (that user's own) gets no bits: 0600."""
    if os.geteuid() != 0:
        pytest.skip("giving a file another user's group needs root")
    kept = shared_folder / "kept.jsonl"
    kept.write_text("old")
    os.chown(kept, -1, NOBODY)
    kept.chmod(0o640)
    with files.replacing(kept, keep_mode=True) as tmp:
        tmp.write_text("new")
    assert (kept.stat().st_gid, stat.S_IMODE(kept.stat().st_mode)) == (NOBODY, 0o640)
    theirs = shared_folder / "theirs.jsonl"
    theirs.write_text("old")
    os.chown(theirs, NOBODY, 0)  # the other user's file, of a group it is not in
    theirs.chmod(0o640)
    as_other_user("python3", "-c", (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('files', sys.argv[1])\n"
        "files = importlib.util.module_from_spec(spec); spec.loader.exec_module(files)\n"
        "with files.replacing(sys.argv[2], keep_mode=True) as tmp:\n"
        "    tmp.write_text('new')\n"), files.__file__, str(theirs))
    assert theirs.read_text() == "new"
    assert (theirs.stat().st_gid, stat.S_IMODE(theirs.stat().st_mode)) == (NOBODY, 0o600)


def test_a_saved_model_survives_a_crash_while_it_is_saved_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    client = np.repeat([0, 1, 2], 20)
    path = tmp_path / "model.json"
    FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=client).save(path)
    before = path.read_bytes()
    _crash_halfway(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        FedForestClassifier(n_estimators=3, max_depth=3, random_state=1).fit(
            X, y, client=client).save(path)
    assert path.read_bytes() == before
    FedForestClassifier.load(path)


def test_a_site_identity_key_survives_a_crash_while_it_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClientState(tmp_path / "state")
    state.write_secret("identity-j.ed25519", b"a" * 32)
    _crash_halfway(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        state.write_secret("identity-j.ed25519", b"b" * 32)
    assert state.read_secret("identity-j.ed25519") == b"a" * 32
    mode = stat.S_IMODE((tmp_path / "state" / "identity-j.ed25519").stat().st_mode)
    assert mode == 0o600


def test_writing_into_a_missing_directory_names_the_file_and_the_directory(
        tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "m.json"
    with pytest.raises(FileNotFoundError) as exc:
        write_atomic(target, b"{}")
    assert str(exc.value) == (f"[Errno 2] cannot write {target}: No such file or directory "
                              f"(no directory {target.parent})")


def test_a_state_directory_made_by_the_client_is_owner_only_and_an_existing_one_keeps_its_mode(
        tmp_path: Path) -> None:
    """A new state directory is made 0700; a directory of the user's that exists (their
    working directory, readable by others) keeps its mode: its secret files are 0600 each."""
    ClientState(tmp_path / "new")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    shared = tmp_path / "work"
    shared.mkdir()
    shared.chmod(0o755)
    state = ClientState(shared)
    state.write_secret("identity-j.ed25519", b"a" * 32)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "identity-j.ed25519").stat().st_mode) == 0o600


_APPEND_RECEIPTS = """\
import sys
from fedforest_secure.audit import Receipt, write_receipt
folder, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for r in range(1, n + 1):
    write_receipt(folder, Receipt(job_id=job, round_id=r, client="site-a",
                                  upload_digest=f"{r:064x}", chain_head_seen="ab" * 32,
                                  seq_seen=r))
"""


def test_two_clients_appending_receipts_at_once_keep_every_line_whole(tmp_path: Path) -> None:
    """Two clients of one site (two jobs, one state directory) append to the site's one
    receipt file at the same time: every receipt of both is there, each on a line of its own."""
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env
    from fedforest_secure.audit import read_receipts

    n = 400
    procs = [subprocess.Popen([sys.executable, "-c", _APPEND_RECEIPTS, str(tmp_path), job,
                               str(n)], env=child_env()) for job in ("job-a", "job-b")]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    read = [rec for _, rec in read_receipts(tmp_path)]
    assert not [rec for rec in read if isinstance(rec, ValueError)]
    got = sorted((rec.job_id, getattr(rec, "round_id", 0)) for rec in read)
    assert got == sorted((job, r) for job in ("job-a", "job-b") for r in range(1, n + 1))


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """A client that died in the middle of a line (a full disk, a kill) leaves it torn: the
    next line appended is still whole, not glued to the torn one."""
    path = tmp_path / "receipts.jsonl"
    path.write_text('{"whole": 1}\n{"torn": ')
    files.append_line(path, '{"next": 2}')
    assert path.read_text().splitlines() == ['{"whole": 1}', '{"torn": ', '{"next": 2}']
    files.append_line(tmp_path / "new.jsonl", '{"first": 1}')
    assert (tmp_path / "new.jsonl").read_text() == '{"first": 1}\n'


def test_the_clients_output_check_makes_a_new_state_directory_owner_only(tmp_path: Path) -> None:
    """The check before joining makes a missing --state-dir: 0700, as ClientState makes it."""
    import types

    from client_app import runner

    runner._check_outputs(types.SimpleNamespace(state_dir=tmp_path / "new" / "state",
                                                model_out=None, job="j1"))
    assert stat.S_IMODE((tmp_path / "new" / "state").stat().st_mode) == 0o700


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the new bytes are written (ENOSPC)."""
    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_write_all", full)


def test_a_write_on_a_full_disk_names_the_file_and_says_the_disk_is_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.json"
    _disk_full(monkeypatch)
    with pytest.raises(OSError) as exc:
        write_atomic(path, b"{}")
    assert exc.value.errno == errno.ENOSPC
    assert str(exc.value) == (f"[Errno 28] cannot write {path}: the disk is full (No space "
                              "left on device)")
    assert files.os_error_text(exc.value) == (f"cannot write {path}: the disk is full (No "
                                              "space left on device)")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_line_appended_on_a_full_disk_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "receipts.jsonl"
    _disk_full(monkeypatch)
    with pytest.raises(OSError) as exc:
        files.append_line(path, "{}")
    assert str(exc.value) == (f"[Errno 28] cannot write {path}: the disk is full (No space "
                              "left on device)")


def test_the_commands_error_line_names_the_file_and_the_full_disk(
        capsys: pytest.CaptureFixture[str]) -> None:
    from fedforest_cli._common import fail

    with pytest.raises(typer.Exit):
        fail(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/srv/site/state/receipts.jsonl"))
    assert capsys.readouterr().err == ("error: /srv/site/state/receipts.jsonl: the disk is full "
                                       "(No space left on device)\n")


def test_the_commands_error_line_names_both_files_of_a_failed_rename(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedforest_cli._common import fail

    (tmp_path / "f").write_text("x")
    (tmp_path / "sub").mkdir()
    with pytest.raises(OSError) as exc:
        os.replace(tmp_path / "f", tmp_path / "sub")  # a file over a directory
    with pytest.raises(typer.Exit):
        fail(exc.value)
    assert capsys.readouterr().err == (f"error: {tmp_path / 'f'} -> {tmp_path / 'sub'}: Is a "
                                       "directory\n")


def test_a_finished_job_whose_statistics_cannot_be_written_is_still_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from client_app.context import ClientResult
    from client_app.log import SiteLog
    from client_app.runner import save_stats

    out = io.StringIO()
    _disk_full(monkeypatch)
    save_stats(tmp_path, ClientResult(status="done"), "job-a", "{}",
               SiteLog(stream=out, plain=True))
    assert out.getvalue().split(" ", 2)[2] == (
        f"warning: job job-a ended (done); its statistics were not saved: cannot write "
        f"{tmp_path / 'stats.json'}: the disk is full (No space left on device)\n")


def test_an_interrupt_just_as_the_temporary_file_is_made_leaves_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM/SIGHUP, which every command turns into one) landing just after the
    temporary file beside the target was made, before its block began: the temporary file is
    removed, the target is as it was."""
    from fedforest_secure import files

    target = tmp_path / "s.pem"
    target.write_text("old")
    real_close = os.close
    calls: list[int] = []

    def close(fd: int) -> None:
        real_close(fd)
        if not calls:
            calls.append(fd)
            raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "close", close)
    with pytest.raises(KeyboardInterrupt), files.replacing(target) as tmp:
        tmp.write_text("new")
    monkeypatch.undo()
    assert calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pem"]
    assert target.read_text() == "old"
