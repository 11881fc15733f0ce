"""The spool of masked uploads on a full disk, and with files in it that are not its own."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_server_secagg_api import (
    K,
    aggregate,
    env,  # noqa: F401 (the fixture)
    first_round,
    join_all,
    post_upload,
    run_until_upload,
    sign,
    unmask,
    upload_body,
)

from fedforest_secure import files
from fedforest_secure.secure_sum import make_codec
from server_app.logs import LOGGER
from server_app.spool import Spool


@pytest.fixture()
def disk_full_under(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """While the yielded list names a folder, a write to a file under it gets 16 bytes onto
    the disk and then ``ENOSPC``, as on a disk that fills up during the write."""
    full: list[Path] = []
    real_write = os.write

    def write(fd: int, data: bytes | memoryview) -> int:
        where = os.readlink(f"/proc/self/fd/{fd}")
        if any(where.startswith(f"{folder}/") for folder in full):
            if os.fstat(fd).st_size >= 16:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, memoryview(data).cast("B")[:16])
        return real_write(fd, data)

    monkeypatch.setattr(files.os, "write", write)
    yield full


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_an_upload_the_spool_cannot_write_is_a_503_leaves_no_file_and_counts_once_resent(
        env: dict, tmp_path: Path, disk_full_under: list[Path],  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    spool = tmp_path / "server.db.spool"
    env["state"].spool = spool
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert vecs[0].nbytes > 16  # the write is cut short, not refused at once
    bodies = {k: upload_body(env, sa, k, task, vecs[k]) for k in range(K)}
    disk_full_under.append(spool)
    resp = post_upload(env, 0, r, bodies[0])
    assert resp.status_code == 503, resp.text
    assert resp.json() == {
        "error": "upload_not_stored",
        "detail": "the server could not store the upload (its disk is full, or a write "
                  "failed); it was not counted: send it again later"}
    assert [p.name for p in (spool / "job-a" / str(r)).iterdir()] == []  # no short file
    said = [x.getMessage() for x in caplog.records
            if x.getMessage().startswith("event=spool_write_failed ")]
    assert len(said) == 1
    assert (f"cannot write the masked upload {spool / 'job-a' / str(r) / '0.u64'} to the "
            "spool: disk full (No space left on device); the upload was not counted (the "
            "site sends it again): free space on the spool's disk") in said[0]
    disk_full_under.clear()  # space freed: the site's retry is counted, and the round closes
    for k in range(K):
        assert post_upload(env, k, r, bodies[k]).status_code == 200
    assert sorted(p.name for p in (spool / "job-a" / str(r)).iterdir()) == \
        [f"{k}.u64" for k in range(K)]
    assert (spool / "job-a" / str(r) / "0.u64").stat().st_size == vecs[0].nbytes
    for step in (sign, unmask):
        for k in range(K):
            assert step(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)


def test_the_sweep_leaves_a_stray_file_alone_says_so_once_and_sweeps_the_closed_rounds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    root = tmp_path / "spool"
    spool = Spool(root)
    spool.write("job-a", 1, 0, np.arange(8, dtype="<u8"))
    spool.write("job-a", 2, 0, np.arange(8, dtype="<u8"))
    (root / "notes.txt").write_text("an operator's file\n")
    (root / "job-a" / "3").write_text("not a round's folder\n")
    for _ in range(2):
        spool.sweep(lambda job: ("running", 2))
    assert sorted(p.name for p in (root / "job-a").iterdir()) == ["2", "3"]
    assert (root / "notes.txt").read_text() == "an operator's file\n"
    said = [x.getMessage() for x in caplog.records
            if x.getMessage().startswith("event=spool_stray ")]
    assert said == [f"event=spool_stray path={root / 'notes.txt'} "
                    'detail="not a job\'s folder of the spool: left alone"']


def test_a_spool_write_that_fails_for_another_cause_names_it_and_not_a_full_disk(
        tmp_path: Path) -> None:
    """A spool whose job folder cannot be made (a file stands where it should be): the error
    names the cause and the spool directory to check, not a full disk to free."""
    from server_app.spool import Spool, SpoolError

    root = tmp_path / "spool"
    root.mkdir()
    (root / "job-a").write_text("not a folder")
    with pytest.raises(SpoolError) as exc:
        Spool(root).write("job-a", 1, 0, np.arange(4, dtype=np.uint64))
    said = str(exc.value)
    assert said.startswith(f"cannot write the masked upload {root / 'job-a' / '1' / '0.u64'} "
                           "to the spool: ")
    assert said.endswith(f"the upload was not counted (the site sends it again): check the "
                         f"spool directory {root} (its disk, permissions and limits)")
    assert "disk full" not in said and "free space" not in said


def test_the_sweep_removes_the_folder_of_a_job_that_is_not_running_once_it_is_empty(
        tmp_path: Path) -> None:
    """A finished job's folder goes with its last round's uploads, and so does an empty folder
    an earlier server left of a finished or deleted job; a running job's empty folder waits
    for its next round, and a folder holding something not the spool's is left alone."""
    root = tmp_path / "spool"
    spool = Spool(root)
    spool.write("done", 4, 0, np.arange(8, dtype="<u8"))
    spool.write("running", 1, 0, np.arange(8, dtype="<u8"))
    for job in ("old-done", "gone", "running-between-rounds"):
        (root / job).mkdir()
    (root / "failed").mkdir()
    (root / "failed" / "notes.txt").write_text("an operator's file\n")
    where = {"done": ("done", 4), "running": ("running", 1), "old-done": ("done", 7),
             "running-between-rounds": ("running", 3), "failed": ("failed", 2)}
    spool.sweep(where.get)
    assert sorted(p.name for p in root.iterdir()) == ["failed", "running",
                                                      "running-between-rounds"]
    assert [p.name for p in (root / "running").iterdir()] == ["1"]
