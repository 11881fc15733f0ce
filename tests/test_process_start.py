"""How a ``fedforest`` process starts: every server and client of a federation (and of the
tests) is one."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from fedforest_cli.sim_data import schema_dict, write_site_files
from fedforest_cli.sim_processes import child_env
from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.startup import lasting_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_fedforest_process_freezes_what_its_imports_made_before_the_command_runs() -> None:
    """``python -m fedforest_cli`` and the installed ``fedforest`` script run ``main``, which
    moves the objects of the command's imports out of the collector's reach (``gc.freeze``)
    before the command runs: the count of frozen objects is what the command sees."""
    seen = subprocess.run(
        [sys.executable, "-c",
         "import gc, fedforest_cli.cli as cli\n"
         "cli.app = lambda **kw: print(gc.get_freeze_count(), gc.isenabled(), kw['prog_name'])\n"
         "from fedforest_cli.__main__ import main\n"
         "main()\n"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    assert seen.returncode == 0, seen.stderr
    frozen, collecting, prog = seen.stdout.split()
    assert prog == "fedforest"
    assert int(frozen) > 10_000  # the modules, classes and functions of typer, click, rich, ...
    assert collecting == "True"  # the collector runs again for the command
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedforest"] == "fedforest_cli.__main__:main"


# ------------------------------------------------------------------------- lasting_imports
@pytest.fixture()
def collector() -> Any:
    """The collector as this test found it afterwards: enabled or not, nothing frozen."""
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.unfreeze()
        (gc.enable if enabled else gc.disable)()


def test_lasting_imports_stops_the_collector_inside_and_freezes_at_the_end(collector: Any
                                                                           ) -> None:
    gc.enable()
    frozen = gc.get_freeze_count()
    with lasting_imports():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # noqa: F841 (tracked objects, frozen at the end)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + 1000


def test_lasting_imports_gives_the_collector_back_when_an_import_fails(collector: Any) -> None:
    gc.enable()
    with pytest.raises(ModuleNotFoundError), lasting_imports():
        import fedforest_secure.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert gc.isenabled()


def test_lasting_imports_leaves_a_stopped_collector_stopped(collector: Any) -> None:
    gc.disable()  # stopped by its caller (an outer block): the caller starts it again
    with lasting_imports():
        pass
    assert not gc.isenabled()


#: ``fedforest`` with argv[1:] in this process, as the installed script runs it; at exit
#: prints, as JSON, whether the collector runs and the top-level packages each
#: ``lasting_imports`` block imported
_RECORDED = """
import atexit, contextlib, gc, json, sys
import fedforest_secure.startup as startup
blocks = []
made_with = startup.lasting_imports
@contextlib.contextmanager
def recorded():
    before = set(sys.modules)
    with made_with():
        yield
    blocks.append(sorted({m.split(".")[0] for m in set(sys.modules) - before}))
startup.lasting_imports = recorded
atexit.register(lambda: print(json.dumps({"collecting": gc.isenabled(), "blocks": blocks,
                                           "dp": "diffprivlib" in sys.modules})))
sys.argv = ["fedforest", *sys.argv[1:]]
from fedforest_cli.__main__ import main
main()
"""


def test_a_site_client_reaches_its_first_request_without_the_dp_stack(
        tmp_path: Path, tiny_parts: Any) -> None:
    """A client with the default profile, up to its first request (the offer; the server is
    not there): it has not imported the DP stack, which it loads only once an offer says the
    job's profile has DP, and the collector runs again after its start's imports."""
    parts, feat = tiny_parts
    (site,) = write_site_files(tmp_path, ["a"], parts[:1], feat, "classification",
                               schema_dict(*parts[0], "classification", feat))
    out = subprocess.run(
        [sys.executable, "-c", _RECORDED, "client", "--insecure-dev",
         "--server", f"http://127.0.0.1:{free_port()}", "--token", "t", "--job", "j",
         "--schema", str(tmp_path / "schema.toml"), "--data", str(site),
         "--retry-budget", "0", "--state-dir", str(tmp_path / "state"), "--quiet"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    assert "GET /v1/jobs/j/offer: the server at" in out.stderr  # its first request
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["collecting"] is True
    assert seen["dp"] is False, seen["blocks"]
    assert seen["blocks"] and not any("diffprivlib" in b for b in seen["blocks"])


def _serve_an_offer(offer: dict[str, Any]) -> tuple[ThreadingHTTPServer, list[str]]:
    """A stand-in server on 127.0.0.1 that answers a job's offer with ``offer`` and every other
    request with 404; it records the requests."""
    seen: list[str] = []

    class Offer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            body = json.dumps(offer).encode() if self.path == "/v1/jobs/j/offer" else b"{}"
            self.send_response(200 if self.path == "/v1/jobs/j/offer" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Offer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_site_client_offered_a_dp_job_imports_the_dp_stack_with_the_collector_stopped(
        tmp_path: Path, tiny_parts: Any) -> None:
    """A client offered a job whose profile has DP imports the DP stack (diffprivlib, SciPy,
    scikit-learn) after the offer, in a ``lasting_imports`` block, and the collector runs
    again afterwards."""
    parts, feat = tiny_parts
    (site,) = write_site_files(tmp_path, ["a"], parts[:1], feat, "classification",
                               schema_dict(*parts[0], "classification", feat))
    config = JobConfig(job_id="j", task="regression", n_features=len(feat), n_clients=2,
                       feature_bounds=((-1.0, 1.0),) * len(feat), target_bound=1.0,
                       n_estimators=1, max_depth=2, min_samples_leaf=2, max_features=2,
                       n_bins=4, profile=load_profile("secure-dp").to_dict())
    server, requests = _serve_an_offer({"client_index": 0,
                                        "config": json.loads(config.to_json())})
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RECORDED, "client", "--insecure-dev",
             "--server", f"http://127.0.0.1:{server.server_address[1]}", "--token", "t",
             "--job", "j", "--schema", str(tmp_path / "schema.toml"), "--data", str(site),
             "--retry-budget", "0", "--state-dir", str(tmp_path / "state"), "--quiet"],
            capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    finally:
        server.shutdown()
        server.server_close()
    assert requests[0] == "GET /v1/jobs/j/offer", requests
    assert out.returncode != 0  # the stand-in answers nothing after the offer
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["collecting"] is True and seen["dp"] is True
    dp_blocks = [b for b in seen["blocks"] if "diffprivlib" in b]
    assert len(dp_blocks) == 1 and {"sklearn", "scipy"} <= set(dp_blocks[0]), seen["blocks"]


def test_the_server_serves_with_the_collector_running(tmp_path: Path) -> None:
    """``fedforest server`` up to serving (uvicorn's run, replaced here by a print): its
    modules are frozen, and the collector runs for the requests."""
    config = tmp_path / "server.toml"
    config.write_text(f'host = "127.0.0.1"\ndatabase = "sqlite:///{tmp_path / "s.db"}"\n'
                      f'audit_database = "sqlite:///{tmp_path / "audit.db"}"\n')
    code = ("import gc, sys, uvicorn\n"
            "uvicorn.Server.run = lambda self, sockets=None: print(gc.get_freeze_count(), "
            "gc.isenabled())\n"
            "sys.argv = ['fedforest', *sys.argv[1:]]\n"
            "from fedforest_cli.__main__ import main\n"
            "main()\n")
    out = subprocess.run([sys.executable, "-c", code, "server", "--config", str(config),
                          "--insecure-dev", "--port", str(free_port())],
                         capture_output=True, text=True, env=child_env(), timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    frozen, collecting = out.stdout.split()
    assert int(frozen) > 50_000  # the command line's and the server's modules
    assert collecting == "True"
