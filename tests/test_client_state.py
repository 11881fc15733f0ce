"""The client's state directory against the other users of the machine: it is the site user's
alone, its identity keys are used only when no one else wrote or can read them, and its lock
and log files are never written through a link someone else put there."""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from other_user import NOBODY, as_other_user, plant_file, shared_folder

from client_app.evaluation import EvalLedger
from client_app.secagg_session import identity_key
from client_app.state import ClientState, holding_output, make_state_dir
from fedforest_secure.errors import FedForestError

__all__ = ["shared_folder"]  # the fixture, imported for the tests below

PRECIOUS = "id,value\n" + "".join(f"{i},{i * i}\n" for i in range(100))


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _precious(folder: Path) -> Path:
    """A file of the site's user outside the state directory (its data), 0600."""
    path = folder / "precious.csv"
    path.write_text(PRECIOUS)
    os.chmod(path, 0o600)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- the state directory ----------------------------------------------------------------------

def test_a_state_directory_another_user_made_is_refused(shared_folder: Path) -> None:
    """The other user makes the directory the site names (a shared folder's) and puts an
    identity key it knows in it: the client refuses the directory, and so never uses the key."""
    state = shared_folder / "state"
    as_other_user("mkdir", "-m", "700", str(state))
    with pytest.raises(FedForestError) as exc:
        ClientState(state)
    assert str(exc.value) == (
        f"--state-dir {state} belongs to another user (uid {NOBODY}), who could put this "
        "site's identity key or links to this user's files in it. Give the client a "
        "directory of this user's own (one that does not exist is made, for this user only), "
        f"or make this one this user's: chown root {state}")


@pytest.mark.parametrize(("mode", "whom"), [(0o777, "other users of this machine"),
                                            (0o1777, "other users of this machine"),
                                            (0o770, "its group")])
def test_a_state_directory_others_or_its_group_can_write_is_refused(
        tmp_path: Path, mode: int, whom: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, mode)
    with pytest.raises(FedForestError) as exc:
        make_state_dir(state)
    assert str(exc.value) == (
        f"--state-dir {state}: {whom} can write it (mode {mode:04o}), and could put this "
        "site's identity key or links to this user's files in it. Make it writable by this "
        f"user only: chmod go-w {state} (chmod 700 {state} keeps its receipts private too), "
        "and remove the files in it this user did not put there")


def test_the_check_before_joining_refuses_a_state_directory_others_can_write(
        tmp_path: Path) -> None:
    """The refusal comes from the client's first check, before anything is sent."""
    import types

    from client_app import runner

    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    with pytest.raises(FedForestError, match="can write it"):
        runner._check_outputs(types.SimpleNamespace(state_dir=state, model_out=None, job="j1"))


def test_a_state_directory_behind_another_user_s_link_is_refused(
        shared_folder: Path, tmp_path: Path) -> None:
    """The other user's link in a shared folder names a directory of the site's: it could
    point it elsewhere once checked. A link of the site user's own is followed."""
    own = make_state_dir(tmp_path / "state")
    link = shared_folder / "state"
    as_other_user("ln", "-s", str(own), str(link))
    with pytest.raises(FedForestError) as exc:
        ClientState(link)
    assert str(exc.value) == (
        f"--state-dir {link} is a symbolic link another user (uid {NOBODY}) made, who can "
        "point it at another directory at any time. Name the directory itself (its real "
        "path), one of this user's own")
    mine = tmp_path / "mine"
    mine.symlink_to(own)
    assert ClientState(mine).root == mine


def _opened_once(shared_folder: Path) -> Path:
    """A state directory of the site's that others could write once (0777, as an earlier
    client left it under umask 000) and that the site then made 0700."""
    state = shared_folder / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o777)
    return state


def test_files_another_user_planted_are_not_written_once_the_directory_is_private(
        shared_folder: Path) -> None:
    """Planted while the directory was open, kept after ``chmod 700``: the other user's
    receipts file (which it can still write) and lock are refused, never written."""
    state = _opened_once(shared_folder)
    receipts, lock = state / "receipts.jsonl", state / "client-j1.lock"
    plant_file(receipts, b'{"job_id": "j0"}\n', 0o666)
    plant_file(lock, b"", 0o666)
    os.chmod(state, 0o700)
    site = ClientState(state)
    with pytest.raises(OSError) as exc:
        site.add_receipt({"job_id": "j1"})
    assert str(exc.value) == (
        f"[Errno 1] cannot open {receipts}: it belongs to another user (uid {NOBODY}), who "
        f"could still change what this process writes to it: remove it (rm {receipts}; it is "
        "made again, this user's); and keep the directory writable by its owner only")
    assert receipts.read_bytes() == b'{"job_id": "j0"}\n'
    with pytest.raises(FedForestError, match=f"cannot open {lock}: it belongs to another "
                                             f"user \\(uid {NOBODY}\\)"), site.locked("j1"):
        pass
    receipts.unlink()  # what the message says to do
    site.add_receipt({"job_id": "j1"})
    assert receipts.stat().st_uid == os.geteuid()


def test_a_receipts_folder_another_user_made_or_linked_is_refused(
        shared_folder: Path, tmp_path: Path) -> None:
    """A ``receipts`` link of the other user's would send the site's receipts elsewhere and
    have it read forged ones; a folder of the other user's holds what it wrote."""
    state = _opened_once(shared_folder)
    receipts = state / "receipts"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    as_other_user("ln", "-s", str(elsewhere), str(receipts))
    os.chmod(state, 0o700)
    with pytest.raises(FedForestError) as exc:
        ClientState(state)
    assert str(exc.value) == (
        f"the receipts folder {receipts} is a symbolic link another user (uid {NOBODY}) "
        f"made, who can point it at another directory at any time. Remove the link (rm "
        f"{receipts}; the folder is made again)")
    receipts.unlink()
    os.chmod(state, 0o777)
    as_other_user("mkdir", "-m", "755", str(receipts))
    os.chmod(state, 0o700)
    with pytest.raises(FedForestError) as exc:
        ClientState(state)
    assert str(exc.value) == (
        f"the receipts folder {receipts} belongs to another user (uid {NOBODY}), who could "
        "put receipts of uploads this site never made, or links to this user's files in it. "
        f"Make this one this user's: chown root {receipts}")
    assert list(elsewhere.iterdir()) == []


def test_a_receipts_folder_others_could_write_or_a_receipt_another_user_wrote_is_refused(
        shared_folder: Path) -> None:
    """A folder an earlier client made 0777 (umask 000) is refused; made 0700, a receipt
    the other user put in it meanwhile (a forged record of an upload, which would make a
    restarted site answer no rounds) is refused too."""
    state = make_state_dir(shared_folder / "state")
    receipts = state / "receipts"
    receipts.mkdir()
    os.chmod(receipts, 0o777)
    with pytest.raises(FedForestError) as exc:
        ClientState(state)
    assert str(exc.value) == (
        f"the receipts folder {receipts}: other users of this machine can write it (mode "
        "0777), and could put receipts of uploads this site never made, or links to this "
        f"user's files in it. Make it writable by this user only: chmod go-w {receipts} "
        f"(chmod 700 {receipts} keeps its receipts private too), and remove the files in it "
        "this user did not put there")
    os.chmod(state, 0o777)
    forged = receipts / "site-a.jsonl"
    plant_file(forged, b'{"job_id": "j1", "kind": "sent"}\n', 0o644)
    os.chmod(state, 0o700)
    os.chmod(receipts, 0o700)
    with pytest.raises(FedForestError) as exc:
        ClientState(state)
    assert str(exc.value) == (
        f"{forged} belongs to another user (uid {NOBODY}), who could have written receipts of "
        "uploads this site never made: the client reads them to know whether it uploaded in a "
        f"job. Remove it (rm {forged}) if this site did not write it, or make it this user's "
        f"if it did (chown root {forged})")
    forged.unlink()
    assert not ClientState(state).uploaded_in("j1")


def test_a_readable_state_directory_of_the_user_s_own_is_used(tmp_path: Path) -> None:
    """A working directory (0755) of the site's user is a state directory: it keeps its mode."""
    state = tmp_path / "work"
    state.mkdir()
    os.chmod(state, 0o755)
    ClientState(state).add_receipt({"job_id": "j1"})
    assert _mode(state) == 0o755


def test_a_new_state_directory_is_never_open_to_others_even_under_umask_000(
        tmp_path: Path, umask_000: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made 0700 by the mkdir itself: no moment in which another user could put a file in
    it (as between a mkdir 0777 and a chmod)."""
    made: list[tuple[Path, int]] = []
    mkdir = pathlib.Path.mkdir

    def watched(self: Path, *args: Any, **kwargs: Any) -> None:
        mkdir(self, *args, **kwargs)
        made.append((self, _mode(self)))

    monkeypatch.setattr(pathlib.Path, "mkdir", watched)
    state = tmp_path / "new" / "state"
    ClientState(state)
    assert {m for p, m in made if p == state} == {0o700}
    assert _mode(state) == 0o700


def test_the_receipts_folder_is_the_site_s_alone_under_umask_000(
        tmp_path: Path, umask_000: None) -> None:
    from fedforest_secure.audit import GENESIS, Receipt, write_receipt

    state = ClientState(tmp_path / "state")
    write_receipt(state.root / "receipts", Receipt(
        job_id="j1", round_id=1, client="site-a", upload_digest="0" * 64,
        chain_head_seen=GENESIS, seq_seen=0))
    assert _mode(state.root / "receipts") == 0o700


# -- the identity key -------------------------------------------------------------------------

def test_an_identity_key_another_user_wrote_is_refused(shared_folder: Path) -> None:
    """The other user put a key it knows into the site's directory while it was open (it is
    the site's, 0700 now): the client refuses the key, never signs with it."""
    state = shared_folder / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o777)
    key = state / "identity-j1.ed25519"
    plant_file(key, bytes(range(32)), 0o600)
    os.chmod(state, 0o700)
    with pytest.raises(FedForestError) as exc:
        identity_key(ClientState(state), "j1")
    assert str(exc.value) == (
        f"{key} belongs to another user (uid {NOBODY}), who wrote this site's secret key and "
        "may know it, and so sign as this site. If it is the site's own key (restored by "
        f"another user), make it this user's: chown root {key} && chmod 600 {key}. This "
        "client did not use the key (this site's identity in job j1)")


@pytest.mark.parametrize(("mode", "whom"), [(0o644, "other users of this machine"),
                                            (0o602, "other users of this machine"),
                                            (0o640, "its group"), (0o620, "its group")])
def test_an_identity_key_others_or_its_group_can_read_or_write_is_refused(
        tmp_path: Path, mode: int, whom: str) -> None:
    """A key restored from a backup with a plain ``cp`` (0644) is refused until it is 0600."""
    state = ClientState(tmp_path / "state")
    key = state.root / "identity-j1.ed25519"
    key.write_bytes(bytes(range(32)))
    os.chmod(key, mode)
    with pytest.raises(FedForestError) as exc:
        identity_key(state, "j1")
    assert str(exc.value) == (
        f"{key}: {whom} can read or write it (mode {mode:04o}): whoever reads this site's "
        "secret key can sign as this site, and whoever writes it can put a key of their own "
        f"in its place. Make it this user's only: chmod 600 {key} (on a file system that "
        "keeps no permissions of its own, a vfat or exFAT drive or an SMB share, chmod "
        "cannot: mount it with fmask=077 or file_mode=0600, or move the state directory to "
        "another file system). This client did not use the key (this site's identity in job "
        "j1)")
    os.chmod(key, 0o600)  # what the message says to do
    assert bytes(identity_key(state, "j1")) == bytes(range(32))


def test_an_identity_key_behind_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    state = ClientState(tmp_path / "state")
    elsewhere = tmp_path / "known.key"
    elsewhere.write_bytes(bytes(range(32)))
    os.chmod(elsewhere, 0o600)
    key = state.root / "identity-j1.ed25519"
    key.symlink_to(elsewhere)
    with pytest.raises(FedForestError) as exc:
        identity_key(state, "j1")
    assert str(exc.value) == (
        f"{key} is a symbolic link: this site's secret key is read from a file of the state "
        "directory only, never through a link (whoever made the link may know the key it "
        f"points to). Put the file itself in its place (owned by this user, chmod 600 {key}). "
        "This client did not use the key (this site's identity in job j1)")


def test_the_site_s_own_identity_key_is_made_once_and_used_again(tmp_path: Path) -> None:
    state = ClientState(tmp_path / "state")
    made = identity_key(state, "j1")
    assert _mode(state.root / "identity-j1.ed25519") == 0o600
    assert isinstance(made, SigningKey) and bytes(identity_key(state, "j1")) == bytes(made)


def test_the_check_before_joining_refuses_an_identity_key_others_can_read(
        tmp_path: Path) -> None:
    """A restarted site whose key a plain ``cp`` left 0644 is refused by the client's first
    check, before it asks the server for the job."""
    import types

    from client_app import runner

    state = ClientState(tmp_path / "state")
    key = state.root / "identity-j1.ed25519"
    key.write_bytes(bytes(range(32)))
    os.chmod(key, 0o644)
    opts = types.SimpleNamespace(state_dir=state.root, model_out=None, job="j1")
    with pytest.raises(FedForestError, match="other users of this machine can read or write "
                                             "it \\(mode 0644\\)"):
        runner._check_outputs(opts)
    os.chmod(key, 0o600)
    runner._check_outputs(opts)
    key.unlink()  # a site new to the job: its key is made when it joins
    runner._check_outputs(opts)


def test_a_new_identity_key_a_file_system_does_not_keep_private_is_refused_and_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a vfat drive or an SMB share every file gets the mode of the mount options
    (0644 here, played by a write that ends with that mode): the new key is refused at once,
    before the join sends it, and removed; not used now and refused only at a restart."""
    from client_app import state as state_module

    write_atomic = state_module.write_atomic

    def no_modes(path: Path, data: bytes, **kwargs: Any) -> None:
        write_atomic(path, data, **kwargs)
        os.chmod(path, 0o644)  # what the file system shows, whatever was asked

    monkeypatch.setattr(state_module, "write_atomic", no_modes)
    state = ClientState(tmp_path / "state")
    key = state.root / "identity-j1.ed25519"
    with pytest.raises(FedForestError) as exc:
        identity_key(state, "j1")
    assert str(exc.value) == (
        f"{key} was written for this user only (mode 0600), but its file system shows it as "
        "mode 0644: one that keeps no permissions of its own (a vfat or exFAT drive, an SMB "
        "share), where others may read this site's secret key and chmod cannot help. The "
        "file was removed. Give --state-dir a directory on another file system, or mount this "
        "one so that its files are this user's only (the mount options fmask=077 for vfat or "
        "exFAT, file_mode=0600 for an SMB share). This site has not joined job j1")
    assert not key.exists()


# -- lock and log files -----------------------------------------------------------------------

def test_the_out_lock_another_user_linked_to_a_site_file_is_refused_and_the_file_kept(
        shared_folder: Path, tmp_path: Path) -> None:
    """The other user links ``.model.json.lock`` in a shared results folder (--out's) to a
    file of the site's: the client refuses the lock rather than truncate that file."""
    precious = _precious(tmp_path)
    lock = shared_folder / ".model.json.lock"
    as_other_user("ln", "-s", str(precious), str(lock))
    with pytest.raises(FedForestError) as exc, holding_output(shared_folder / "model.json", "j1"):
        pass
    assert str(exc.value) == (
        f"cannot open {lock}: it is a symbolic link, which this file is never opened through "
        "(a link someone else put there would send the writes to another file of this "
        "user's): put the file itself in its place, or remove the link; and keep the "
        "directory writable by its owner only. Nothing was sent to the server")
    assert precious.read_text() == PRECIOUS


def test_a_job_lock_that_is_a_link_or_a_second_name_of_a_file_is_refused(
        tmp_path: Path) -> None:
    precious = _precious(tmp_path)
    state = ClientState(tmp_path / "state")
    lock = state.root / "client-j1.lock"
    lock.symlink_to(precious)
    with pytest.raises(FedForestError, match="it is a symbolic link"), state.locked("j1"):
        pass
    lock.unlink()
    os.link(precious, lock)
    with pytest.raises(FedForestError) as exc, state.locked("j1"):
        pass
    assert str(exc.value) == (
        f"cannot open {lock}: it has 2 names (hard links), and a write here would change the "
        f"file of every name: give it one of its own (cp -p {lock} {lock}.copy && mv "
        f"{lock}.copy {lock}); and keep the directory writable by its owner only. Nothing was "
        "sent to the server")
    assert precious.read_text() == PRECIOUS


def test_receipts_and_the_evaluation_ledger_are_never_written_through_a_link(
        tmp_path: Path) -> None:
    precious = _precious(tmp_path)
    state = ClientState(tmp_path / "state")
    receipts = state.root / "receipts.jsonl"
    receipts.symlink_to(precious)
    with pytest.raises(OSError) as exc:
        state.add_receipt({"job_id": "j1"})
    assert str(exc.value).endswith(f"cannot open {receipts}: it is a symbolic link, which this "
                                   "file is never opened through (a link someone else put "
                                   "there would send the writes to another file of this "
                                   "user's): put the file itself in its place, or remove the "
                                   "link; and keep the directory writable by its owner only")
    (state.root / ".evaluations.lock").symlink_to(precious)
    with pytest.raises(OSError, match="it is a symbolic link"):
        EvalLedger(state.root).check_and_record("ev", ("m",), "rows", evaluation="e",
                                                resumed=False)
    assert precious.read_text() == PRECIOUS


def test_lock_files_and_receipts_of_earlier_runs_are_used_again(tmp_path: Path) -> None:
    """The files a client leaves (its lock files, its receipts) serve the next run."""
    for run in range(2):
        state = ClientState(tmp_path / "state")
        with state.locked("j1"), holding_output(tmp_path / "model.json", "j1"):
            state.add_receipt({"job_id": "j1", "run": run})
        EvalLedger(state.root).check_and_record(f"ev-{run}", ("m",), f"rows-{run}",
                                                evaluation="e", resumed=False)
    assert [r["run"] for r in state.receipts()] == [0, 1]
    for name in ("client-j1.lock", "receipts.jsonl", ".evaluations.lock"):
        assert stat.S_ISREG((state.root / name).lstat().st_mode)
    assert _mode(state.root / "client-j1.lock") == 0o600
