"""A site pins its privacy profile (``fedforest client --profile``); a server cannot downgrade it.

The client gets the job's configuration, profile included, from the server's offer (what the
join would answer). With ``--profile`` it compares that profile with its own, field by field,
before joining and refuses a job whose profile differs (``open`` for a ``secure`` site, secure
aggregation switched off under a ``secure`` label, another DP budget, a lower threshold, ...):
the site never joins, so no other site waits for it in a running job.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_app import declines, runner
from client_app.log import SiteLog
from client_app.runner import (
    ClientOptions,
    ClientResult,
    ProfileRefused,
    check_job_profile,
    pinned_profile,
)
from client_app.state import ClientState
from fedforest_cli.sim_processes import child_env
from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError

JOB = "job-p"


def _config(profile: dict[str, Any]) -> JobConfig:
    return JobConfig(job_id=JOB, task="regression", n_features=2, n_clients=4,
                     feature_bounds=((-1.0, 1.0),) * 2, target_bound=1.0, n_estimators=1,
                     max_depth=2, min_samples_leaf=2, max_features=2, n_bins=4,
                     profile=profile)


@dataclass
class RecordingTransport:
    """Answers the offer and the join with a fixed job configuration and records every
    request."""

    profile: dict[str, Any]
    sent: list[tuple[str, str]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0

    def _job(self) -> dict[str, Any]:
        return {"job_id": JOB, "client_index": 0, "client_name": "site-0",
                "config": json.loads(_config(self.profile).to_json()), "status": "waiting"}

    def post_json(self, path: str, body: Any = None) -> Any:
        self.sent.append(("POST", path))
        self.bodies.append(body)
        return self._job()

    def get_json(self, path: str, params: Any = None) -> Any:
        self.sent.append(("GET", path))
        if path == f"/v1/jobs/{JOB}/offer":
            return self._job()
        raise AssertionError(f"the client sent {path} after the join")

    def request(self, method: str, path: str, **_: Any) -> Any:
        self.sent.append((method, path))
        raise AssertionError(f"the client sent {method} {path} after the join")


def _lying_secure() -> dict[str, Any]:
    """An ``open`` profile relabelled ``secure``: the name is not what is checked."""
    d = load_profile("open").to_dict()
    d["name"], d["description"] = "secure", load_profile("secure").description
    return d


DOWNGRADES = {
    "open_for_secure": ("secure", lambda: load_profile("open").to_dict()),
    "no_secagg_under_the_secure_label": ("secure", _lying_secure),
    "secure_for_secure_dp": ("secure-dp", lambda: load_profile("secure").to_dict()),
    "larger_dp_budget": ("secure-dp", lambda: load_profile("secure-dp", epsilon=8.0).to_dict()),
    "smaller_delta_is_still_different": (
        "secure-dp", lambda: load_profile("secure-dp", delta=1e-9).to_dict()),
    "lower_threshold": ("secure", lambda: load_profile("secure", threshold=0.6).to_dict()),
    "other_abstention_under_dp": (
        "secure-dp", lambda: load_profile("secure-dp", abstain_below=5).to_dict()),
    "other_abstention": ("secure", lambda: load_profile("secure", abstain_below=2).to_dict()),
    "clear_h_splits": ("secure", lambda: load_profile("secure", h_splits="clear").to_dict()),
    "open_for_secure_dp": ("secure-dp", lambda: load_profile("open").to_dict()),
}


@pytest.mark.parametrize("case", sorted(DOWNGRADES))
def test_client_refuses_a_job_whose_profile_differs_from_its_pin(case: str,
                                                                 tmp_path: Path) -> None:
    pin, job_profile = DOWNGRADES[case]
    tr = RecordingTransport(job_profile())
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True, profile=pin)
    with pytest.raises(ProfileRefused, match=f"pinned \\({pin!r}\\)") as info:
        runner._run(opts, tr, ClientState(opts.state_dir), np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                    SiteLog(stream=io.StringIO()), pinned_profile(pin))
    assert "this site did not join the job" in str(info.value)
    # after the offer only the refusal's code: the site declines, it never joins
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/decline")]
    assert tr.bodies == [{"reason": "profile"}]
    assert not (opts.state_dir / "stats.json").exists()


def test_the_refusal_names_each_setting_that_differs() -> None:
    with pytest.raises(ProfileRefused) as info:
        check_job_profile(pinned_profile("secure-dp"), load_profile("open").to_dict())
    msg = str(info.value)
    for key in ("secure_aggregation: job False, pinned True", "fixed_point", "threshold",
                "sketch", "h_splits", "min_clients"):
        assert key in msg, key
    with pytest.raises(ProfileRefused, match="abstain_below: job 2, pinned 0"):
        check_job_profile(pinned_profile("secure-dp"),
                          load_profile("secure-dp", abstain_below=2).to_dict())
    with pytest.raises(ProfileRefused, match="dp: job"):
        check_job_profile(pinned_profile("secure-dp"),
                          load_profile("secure-dp", epsilon=4.0).to_dict())


@pytest.mark.parametrize("bad", [None, "secure", {"name": "secure"},
                                 {**load_profile("secure").to_dict(), "extra": 1},
                                 # a minority unmasks: no profile accepts it
                                 {**load_profile("secure").to_dict(), "threshold": 0.4}])
def test_an_invalid_job_profile_is_refused(bad: Any) -> None:
    with pytest.raises(ProfileRefused, match="not a valid profile"):
        check_job_profile(pinned_profile("secure"), bad)


@pytest.mark.parametrize("name", ["open", "secure", "secure-dp"])
def test_the_same_profile_is_accepted_whatever_its_labels(name: str, tmp_path: Path) -> None:
    job = load_profile(name).to_dict()
    check_job_profile(pinned_profile(name), job)
    check_job_profile(pinned_profile(name), {**job, "name": "site-copy", "description": "x"})
    # a pin may be a TOML file holding the same settings
    path = tmp_path / "mine.toml"
    path.write_text(load_profile(name).to_toml())
    check_job_profile(pinned_profile(str(path)), job)


class _Accepted(Exception):
    """Raised by the stub worker factory: the client accepted the job with this config."""

    def __init__(self, config: JobConfig) -> None:
        super().__init__("accepted")
        self.config = config


def _accepted_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: dict[str, Any],
                     pin: str | None) -> JobConfig:
    """The job configuration the client hands its worker and secure-aggregation session (they
    are built from it) after accepting a job whose profile is ``served``."""
    def capture(config: JobConfig, *_: Any, **__: Any) -> Any:
        raise _Accepted(config)

    monkeypatch.setattr(runner, "site_worker", capture)
    monkeypatch.setattr(runner, "_check_job", lambda *a: None)  # the schema: not this test's
    tr = RecordingTransport(served)
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True, profile=pin)
    with pytest.raises(_Accepted) as info:
        runner._run(opts, tr, ClientState(opts.state_dir), np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                    SiteLog(stream=io.StringIO()), None if pin is None else pinned_profile(pin))
    return info.value.config


@pytest.mark.parametrize(("served", "loads_dp"), [("secure-dp", True), ("secure", False),
                                                 ("open", False)])
def test_the_dp_stack_is_loaded_after_the_offer_and_before_the_join_of_a_dp_job_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str, loads_dp: bool) -> None:
    """A site without a pin learns from the offer whether the job's profile has DP: it loads
    the DP machinery then, before its worker is built and before it joins, and a job without
    DP never loads it."""
    tr = RecordingTransport(load_profile(served).to_dict())
    seen: list[list[tuple[str, str]]] = []
    monkeypatch.setattr(runner, "_import_dp_stack", lambda: seen.append(list(tr.sent)))

    def capture(config: JobConfig, *_: Any, **__: Any) -> Any:
        raise _Accepted(config)

    monkeypatch.setattr(runner, "site_worker", capture)
    monkeypatch.setattr(runner, "_check_job", lambda *a: None)
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    with pytest.raises(_Accepted):
        runner._run(opts, tr, ClientState(opts.state_dir), np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                    SiteLog(stream=io.StringIO()))
    assert seen == ([[("GET", f"/v1/jobs/{JOB}/offer")]] if loads_dp else [])


@pytest.mark.parametrize("pinned", [True, False])
def test_a_setting_the_server_leaves_out_is_read_as_the_profiles_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned: bool) -> None:
    """The server states the job's profile with ``threshold`` (default 1.0: t = n) and
    ``h_splits`` (default "off") left out. The pin check reads PrivacyProfile's defaults; so does
    everything the client runs the job with: one set of defaults, not one per reader."""
    pin = tmp_path / "strict.toml"
    pin.write_text('name = "strict"\nsecure_aggregation = true\nfixed_point = true\n'
                   'sketch = "secure_cdf"\nrows_per_sketch_point = 2\nmin_clients = 3\n')
    served = {k: v for k, v in pinned_profile(str(pin)).items()
              if k not in ("threshold", "h_splits")}
    config = _accepted_config(tmp_path, monkeypatch, served, str(pin) if pinned else None)
    assert config.profile == pinned_profile(str(pin))
    assert config.profile["threshold"] == 1.0 and config.profile["h_splits"] == "off"


def test_an_invalid_job_profile_is_refused_without_a_pin(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--profile`` the site takes the server's profile, but only a valid one: its
    settings are read as PrivacyProfile reads them, or the job is declined."""
    monkeypatch.setattr(runner, "_check_job", lambda *a: None)
    tr = RecordingTransport({**load_profile("secure").to_dict(), "threshold": 0.4})
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    with pytest.raises(ProfileRefused, match="not a valid profile.*threshold > 0.5"):
        runner._run(opts, tr, ClientState(opts.state_dir), np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                    SiteLog(stream=io.StringIO()))
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/decline")]
    assert tr.bodies == [{"reason": "profile"}]


def _no_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  profile: str | None = None) -> ClientOptions:
    """A site's options whose table loads, with a client that fails if it opens a transport."""
    monkeypatch.setattr(runner, "load_site_table", lambda d, s: (np.zeros((1, 1)), np.zeros(1)))

    def no_transport(*a: Any, **k: Any) -> Any:
        raise AssertionError("a transport was opened")

    monkeypatch.setattr(runner, "Transport", no_transport)
    monkeypatch.setattr(declines, "Transport", no_transport)  # a decline's own connection
    for name in ("d.csv", "s.toml"):  # there (their content is the stub's)
        (tmp_path / name).touch()
    return ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True, profile=profile)


def test_an_unknown_pin_fails_before_anything_is_sent(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    opts = _no_transport(tmp_path, monkeypatch, profile="no-such-profile")
    with pytest.raises(FedForestError, match="unknown profile"):
        runner.run_client(opts)


def test_simulate_pins_the_job_profile_on_every_client(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_cli import simulate
    from fedforest_cli.sim_data import SiteData

    cmds: list[list[str]] = []

    class FakePopen:
        def __init__(self, cmd: list[str], **_: Any) -> None:
            cmds.append(cmd)

    monkeypatch.setattr(simulate.subprocess, "Popen", FakePopen)
    site = SiteData("client-0", tmp_path / "c.csv", tmp_path / "s.toml", "tok",
                    np.zeros((1, 1)), np.zeros(1))
    simulate.start_client(site, "https://127.0.0.1:1", JOB, tmp_path, tmp_path / "st",
                          tmp_path / "log", tmp_path / "m.json", profile="secure-dp")
    simulate.start_client(site, "https://127.0.0.1:1", JOB, tmp_path, tmp_path / "st",
                          tmp_path / "log", tmp_path / "m.json")
    first, second = cmds
    assert first[first.index("--profile") + 1] == "secure-dp"
    assert "--insecure-dev" not in first and "--profile" not in second
    import inspect

    src = inspect.getsource(simulate.run_simulation)
    assert "profile=opts.profile" in src


@pytest.mark.parametrize("where,message", [
    ("missing/model.json", "--out {out}: the directory {parent} does not exist"),
    ("a-dir", "--out {out} is a directory; name the model file"),
    ("file/state", "--state-dir {state}: "),
    # a directory this process may not write in (sysfs refuses even root)
    ("/sys/kernel/model.json", "--out {out}: cannot write in {parent}: Permission denied"),
])
def test_an_unwritable_out_or_state_dir_fails_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, message: str) -> None:
    # a job can run for hours: a model path that cannot be written is found before joining
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "file").write_text("a file where a directory should be")
    out = tmp_path / (where if where != "file/state" else "model.json")
    state = tmp_path / ("file/state" if where == "file/state" else "state")
    opts = dataclasses.replace(_no_transport(tmp_path, monkeypatch), state_dir=state,
                               model_out=out)
    with pytest.raises(FedForestError, match=re.escape(
            message.format(out=out, parent=out.parent, state=state))):
        runner.run_client(opts)


def test_a_second_client_of_the_same_job_on_the_same_state_dir_stops_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site started twice for one job: the second process would answer the open secure
    round without the round's keys and get the site dropped. It stops instead, naming the
    job and the first one."""
    opts = _no_transport(tmp_path, monkeypatch)
    first = ClientState(opts.state_dir)
    with first.locked(JOB):
        with pytest.raises(FedForestError, match=re.escape(
                f"another client in this process is running job {JOB} with --state-dir "
                f"{opts.state_dir}: a site runs one client per job")):
            runner.run_client(opts)
    # once the first one has stopped, the directory is free again
    with pytest.raises(AssertionError, match="a transport was opened"):
        runner.run_client(opts)


def test_clients_of_different_jobs_share_a_state_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site in two jobs at once runs two clients on one state directory (the default
    included): the second one goes on to the server while the first holds its own job."""
    opts = _no_transport(tmp_path, monkeypatch)
    with ClientState(opts.state_dir).locked("another-job"):
        with pytest.raises(AssertionError, match="a transport was opened"):
            runner.run_client(opts)


def test_a_job_name_that_is_no_file_name_is_refused_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job names the client's lock file (and its table digest, key and model): a name
    the server cannot have given a job is a slip, said before anything is sent."""
    opts = dataclasses.replace(_no_transport(tmp_path, monkeypatch), job="../j")
    with pytest.raises(FedForestError, match=re.escape("--job '../j' is not a job name")):
        runner.run_client(opts)
    assert not (tmp_path / "client-..").exists() and not list(tmp_path.glob("*.lock"))


_HOLD_STATE = ("import sys, time\n"
               "from pathlib import Path\n"
               "from client_app.state import ClientState\n"
               "with ClientState(Path(sys.argv[1])).locked(sys.argv[2]):\n"
               "    print('held', flush=True)\n"
               "    time.sleep(60)\n")


def _holder(script: str, *args: str) -> subprocess.Popen[bytes]:
    """A process that runs ``script`` with ``args`` and holds what it took until killed."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            env=child_env())
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"held":
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the holder exited with {proc.returncode} before holding")
    return proc


def test_the_state_dir_lock_names_the_job_and_the_process_that_holds_it(
        tmp_path: Path) -> None:
    """A client of the job in another process holds the directory: the message names the job
    and its pid, a client of another job shares the directory meanwhile; once the holder has
    exited (its lock dies with it) the job is free."""
    holder = _holder(_HOLD_STATE, str(tmp_path / "state"), JOB)
    try:
        with pytest.raises(FedForestError, match=rf"another client process \(pid "
                                                 rf"{holder.pid}\) is running job {JOB} with "
                                                 r"--state-dir"):
            with ClientState(tmp_path / "state").locked(JOB):
                pass
        with ClientState(tmp_path / "state").locked("job-q"):  # another job, meanwhile
            pass
    finally:
        holder.kill()
        holder.communicate()
    with ClientState(tmp_path / "state").locked(JOB):
        pass


_HOLD_OUT = ("import sys, time\n"
             "from pathlib import Path\n"
             "from client_app.state import holding_output\n"
             "with holding_output(Path(sys.argv[1]), sys.argv[2]):\n"
             "    print('held', flush=True)\n"
             "    time.sleep(60)\n")


def test_a_second_client_writing_the_same_out_stops_before_anything_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clients (here of different jobs, with their own state directories) that name one
    --out would overwrite each other's model and both say it was saved: the second stops,
    naming the job and the pid of the first; another --out is free, and so is the same file
    once the first client has ended (a rerun overwrites it)."""
    out = tmp_path / "model.json"
    opts = dataclasses.replace(_no_transport(tmp_path, monkeypatch), model_out=out)
    holder = _holder(_HOLD_OUT, str(out), "job-q")
    try:
        with pytest.raises(FedForestError, match=re.escape(
                f"--out {out} is being written by another client process (pid {holder.pid}, "
                "job job-q)")):
            runner.run_client(opts)
        with pytest.raises(AssertionError, match="a transport was opened"):
            runner.run_client(dataclasses.replace(opts, model_out=tmp_path / "other.json"))
    finally:
        holder.kill()
        holder.communicate()
    with pytest.raises(AssertionError, match="a transport was opened"):
        runner.run_client(opts)


def test_the_out_lock_sees_one_file_through_another_spelling_of_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sub/../model.json`` and ``model.json`` are one file: held by a client of this
    process, the second is refused."""
    from client_app.state import holding_output

    (tmp_path / "sub").mkdir()
    opts = dataclasses.replace(_no_transport(tmp_path, monkeypatch),
                               model_out=tmp_path / "sub" / ".." / "model.json")
    with holding_output(tmp_path / "model.json", "job-q"):
        with pytest.raises(FedForestError, match=re.escape(
                "is being written by another client in this process (job job-q)")):
            runner.run_client(opts)


@pytest.mark.parametrize("option", ["data", "schema", "eval_data"])
def test_a_path_that_names_no_file_is_the_sites_typo_not_a_decline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str) -> None:
    """A mistyped --data, --eval-data or --schema path is said at once, and nothing reaches
    the server (it was told the site declines the job: "table")."""
    import dataclasses

    opts = _no_transport(tmp_path, monkeypatch)
    opts = dataclasses.replace(opts, **{option: tmp_path / "nofile.csv"})
    flag = "--" + option.replace("_", "-")
    with pytest.raises(FedForestError, match=f"{flag} .*nofile.csv does not exist: nothing "
                                             "was sent to the server"):
        runner.run_client(opts)


@pytest.mark.parametrize("option", ["data", "schema", "eval_data"])
def test_a_file_the_client_may_not_read_is_said_not_declined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str) -> None:
    """An input file the client process may not read (its permissions) is said at once, and
    nothing reaches the server (it was told the site declines the job: "table")."""
    import dataclasses
    import pathlib

    opts = _no_transport(tmp_path, monkeypatch)
    locked = tmp_path / "locked.csv"
    locked.touch()
    opts = dataclasses.replace(opts, **{option: locked})
    real_open = pathlib.Path.open

    def guarded(self: Path, *a: Any, **k: Any) -> Any:  # chmod 000 does not stop root
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "open", guarded)
    flag = "--" + option.replace("_", "-")
    with pytest.raises(FedForestError, match=f"{flag} .*locked.csv cannot be read "
                                             r"\(Permission denied\): nothing was sent"):
        runner.run_client(opts)


@pytest.mark.parametrize("option", ["data", "schema"])
def test_out_naming_an_input_file_is_refused_before_joining(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str) -> None:
    """--out naming the site's own table (or schema) would replace it with the model."""
    import dataclasses

    opts = _no_transport(tmp_path, monkeypatch)
    opts = dataclasses.replace(opts, model_out=getattr(opts, option))
    with pytest.raises(FedForestError, match=f"--out .* is the --{option} file"):
        runner.run_client(opts)


def _said_at_start(opts: ClientOptions, monkeypatch: pytest.MonkeyPatch) -> str:
    """What the client says (one line of words) when it starts with ``opts``, its transport
    and the job itself stubbed out."""

    class Stub:
        def close(self) -> None:
            pass

    monkeypatch.setattr(runner, "Transport", lambda *a, **k: Stub())
    monkeypatch.setattr(runner, "_run", lambda *a, **k: ClientResult(status="done"))
    out = io.StringIO()
    runner.run_client(opts, log=SiteLog(stream=out, plain=True))
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize(("mode", "whom"), [(0o644, "other users of this machine"),
                                             (0o640, "its group"), (0o600, None)])
def test_a_key_others_can_read_is_named_at_start(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, mode: int,
                                                 whom: str | None) -> None:
    """Whoever reads a site's TLS key can act as the site: a key its group or other users can
    read gets a warning naming the file and the chmod that mends it; one only the site's user
    reads gets none."""
    opts = _no_transport(tmp_path, monkeypatch)
    key = tmp_path / "site.key"
    key.write_text("a key")
    key.chmod(mode)
    opts = dataclasses.replace(opts, cert=tmp_path / "site.pem", key=key)

    said = _said_at_start(opts, monkeypatch)
    if whom is None:
        assert "chmod" not in said, said
    else:
        assert f"--key {key}: {whom} can read it (mode {mode:04o})" in said, said
        assert f"chmod 600 {key}" in said


def test_a_key_inside_cert_that_others_can_read_is_named_by_cert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key inside ``--cert`` (no ``--key``): the warning names ``--cert``, the option the
    site gave."""
    opts = _no_transport(tmp_path, monkeypatch)
    pem = tmp_path / "site.pem"
    pem.write_text("a certificate and its key")
    pem.chmod(0o644)
    opts = dataclasses.replace(opts, cert=pem, key=None)

    said = _said_at_start(opts, monkeypatch)
    assert f"--cert {pem}: other users of this machine can read it (mode 0644)" in said, said


@pytest.mark.parametrize(("status", "said"), [
    ({"audit_seq": 7, "audit_head": "ab" * 32}, None),
    ({"audit_head": "ab" * 32}, "does not announce its audit chain's tip"),
    ({"audit_seq": 0, "audit_head": "0" * 64}, "the server keeps no audit log"),
])
def test_a_failed_jobs_receipt_is_kept_or_its_absence_said_truly(
        tmp_path: Path, status: dict[str, Any], said: str | None) -> None:
    """A site told its job failed keeps a failure receipt of the tip the job status announces;
    a server older than the receipt (no ``audit_seq``, a real head) is not said to keep no
    audit log, which is what a server without one (the genesis head) is told."""
    import contextlib
    import types

    from fedforest_secure.audit import FailedReceipt, read_receipts

    class Tr:
        @contextlib.contextmanager
        def brief(self) -> Any:
            yield

        def get_json(self, path: str) -> dict[str, Any]:
            return {"job_id": JOB, "status": "failed", **status}

    out = io.StringIO()
    ctx = types.SimpleNamespace(tr=Tr(), job=JOB, name="site-a", log=SiteLog(stream=out,
                                plain=True), state=ClientState(tmp_path / "state"))
    runner._failed_receipt(ctx)  # type: ignore[arg-type]
    kept = [r for _, r in read_receipts(tmp_path / "state" / "receipts")]
    if said is None:
        assert kept == [FailedReceipt(JOB, "site-a", "ab" * 32, 7)]
        assert out.getvalue() == ""
    else:
        assert kept == [] and said in " ".join(out.getvalue().split())


@pytest.mark.parametrize(("answer", "said"), [
    ({"audit_seq": 5, "audit_head": "ab" * 32}, None),
    ({"audit_seq": float("inf"), "audit_head": "ab" * 32}, "malformed audit tip"),
    ({"audit_seq": 3.7, "audit_head": "ab" * 32}, "malformed audit tip"),
    ({"audit_seq": "x", "audit_head": "ab" * 32}, "malformed audit tip"),
    ({"recorded": True}, ""),  # an older server: nothing to record, nothing said
])
def test_a_refusal_receipt_is_kept_or_its_absence_said(tmp_path: Path, answer: dict[str, Any],
                                                       said: str | None) -> None:
    """The server's answer to this site's refusal: a receipt of its audit tip is kept; a
    malformed tip is a warning, never a crash (the refusal was recorded all the same)."""
    import types

    from client_app.context import RunContext
    from fedforest_secure.audit import RefusedReceipt, read_receipts

    out = io.StringIO()
    ctx = types.SimpleNamespace(job=JOB, name="site-a", log=SiteLog(stream=out, plain=True),
                                state=ClientState(tmp_path / "state"))
    RunContext.refusal_receipt(ctx, 2, answer)  # type: ignore[arg-type]
    kept = [r for _, r in read_receipts(tmp_path / "state" / "receipts")]
    if said is None:
        assert kept == [RefusedReceipt(JOB, 2, "site-a", "ab" * 32, 5)]
    else:
        assert kept == [] and said in " ".join(out.getvalue().split())


def test_a_refusal_whose_receipt_cannot_be_written_is_still_a_recorded_refusal(
        tmp_path: Path) -> None:
    """The receipts folder cannot be written (a file stands there): the site warns that the
    server recorded its refusal and the receipt is lost; nothing is raised, so the site is not
    told that the server does not know it left."""
    import types

    from client_app.context import RunContext

    state = tmp_path / "state"
    state.mkdir(mode=0o700)  # the site user's alone, whatever the umask (002 too)
    (state / "receipts").write_text("not a folder")
    out = io.StringIO()
    ctx = types.SimpleNamespace(job=JOB, name="site-a", log=SiteLog(stream=out, plain=True),
                                state=ClientState(state))
    RunContext.refusal_receipt(ctx, 2, {"audit_seq": 5, "audit_head": "ab" * 32})  # type: ignore[arg-type]
    assert "recorded this site's refusal of round 2, but its receipt could not be written" in \
        " ".join(out.getvalue().split())


def test_a_token_the_server_no_longer_knows_says_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator rotated or revoked the site's token (or it was mistyped): the site's last
    line says so and what to do, not only the HTTP status."""
    from client_app.transport import ApiRejected

    class Stub:
        def close(self) -> None:
            pass

    def unknown(*_: Any, **__: Any) -> ClientResult:
        raise ApiRejected(401, "unauthenticated", "unknown or revoked token",
                          {"error": "unauthenticated", "detail": "unknown or revoked token"})

    opts = _no_transport(tmp_path, monkeypatch)
    monkeypatch.setattr(runner, "Transport", lambda *a, **k: Stub())
    monkeypatch.setattr(runner, "_run", unknown)
    with pytest.raises(FedForestError, match=r"401 unauthenticated: unknown or revoked token: "
                                             r"the server does not know this site's token .*"
                                             r"ask the federation's coordinator for the "
                                             r"site's current token"):
        runner.run_client(opts)
