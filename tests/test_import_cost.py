"""What a ``fedforest`` process imports to start: every server and site process of a federation
(and of the tests) is one, and each module it imports is CPU spent before the command does
anything. No module imports the DP calibration stack (diffprivlib, which imports much of
scikit-learn) with itself: a site's client loads it once the offer says the job's profile
has DP (before joining), the rest of the code where it calibrates noise. A command imports
what it runs, not what the other commands need (``fedforest --help`` neither side's app, a
site's client none of the server's modules, the server none of a site's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ports import free_port

from fedforest_cli.sim_data import schema_dict, write_site_files
from fedforest_cli.sim_processes import child_env
from fedforest_secure.startup import UNUSED

#: libraries neither the server nor a site's client without DP imports to start (the
#: estimators, DP calibration, plots)
NEVER_AT_START = ("sklearn", "scipy", "diffprivlib", "matplotlib", "pandas")
#: the server's libraries and the coordinator's side of the engine and of the secure sum
SERVER_ONLY = ("fastapi", "starlette", "sqlalchemy", "uvicorn", "server_app",
               "fedforest_secure.coordinator", "fedforest_secure._candidates",
               "fedforest_secure._planner", "fedforest_secure._fused_levels",
               "fedforest_secure._random_levels", "fedforest_secure._release",
               "fedforest_secure.secagg.server", "fedforest_secure.secagg.driver")
#: a site's side of the engine, of the secure sum and of the transport
SITE_ONLY = ("fedforest_secure.worker", "fedforest_secure._routing",
             "fedforest_secure._level_stats", "fedforest_secure._site_table",
             "fedforest_secure.evaluation.worker", "fedforest_secure.secagg.client",
             "client_app.runner", "client_app.transport", "httpx")

#: the names of the modules imported in this process, as JSON (a module marked not installed,
#: None in sys.modules, is not one of them)
_IMPORTED = "json.dumps(sorted(m for m, mod in sys.modules.items() if mod is not None))"
#: runs the ``fedforest`` command of argv[1:] in this process, as the installed script does;
#: prints the imported modules as JSON when the command ends
_RUN = f"""
import atexit, json, sys
atexit.register(lambda: print({_IMPORTED}))
sys.argv = ["fedforest", *sys.argv[1:]]
from fedforest_cli.__main__ import main
main()
"""


def _imported(code: str, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=child_env(), timeout=120, check=False)
    assert out.stdout.strip(), out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _of(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are one of ``packages`` or inside one."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_the_server_and_client_processes_do_not_import_diffprivlib_at_start_up() -> None:
    code = ("import sys, server_app.app, server_app.serve, client_app.runner, "
            "fedforest_secure.coordinator, fedforest_secure.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'diffprivlib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_fedforest_help_imports_neither_app_nor_the_libraries_of_the_commands() -> None:
    modules = _imported(_RUN, "--help")
    assert "typer" in modules  # the command ran
    # client_app.stop: the interrupts the signal handlers record, a module without imports
    apps = [m for m in _of(modules, ("client_app", "server_app"))
            if m not in ("client_app", "client_app.stop")]
    assert apps == []
    assert _of(modules, (*NEVER_AT_START, "numpy", "pydantic", "httpx", "cryptography",
                         "nacl", "sqlalchemy", "fastapi", "uvicorn")) == []


def test_a_site_client_starts_without_the_servers_modules(tmp_path: Path,
                                                          tiny_parts: Any) -> None:
    """``fedforest client`` with a profile without DP, up to its first request (the server is
    not there): the client's modules are in, the server's, the coordinator's and the DP
    stack's are not (the DP stack loads after an offer of a DP job: tests/test_client_profile.py;
    with the default profile, up to the offer, without it: tests/test_process_start.py)."""
    parts, feat = tiny_parts
    (site,) = write_site_files(tmp_path, ["a"], parts[:1], feat, "classification",
                               schema_dict(*parts[0], "classification", feat))
    out = subprocess.run(
        [sys.executable, "-c", _RUN, "client", "--insecure-dev",
         "--server", f"http://127.0.0.1:{free_port()}", "--token", "t", "--job", "j",
         "--schema", str(tmp_path / "schema.toml"), "--data", str(site), "--profile", "open",
         "--retry-budget", "0", "--state-dir", str(tmp_path / "state"), "--quiet"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    assert "GET /v1/jobs/j/offer: the server at" in out.stderr  # its first request
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "client_app.transport" in modules
    assert _of(modules, NEVER_AT_START) == []
    assert _of(modules, SERVER_ONLY) == []
    # an evaluation job's statistics (and the model files they score): imported for one
    assert _of(modules, ("fedforest_secure.evaluation", "fedforest_secure.model")) == []
    # nor the optional imports of its libraries that it never uses (httpcore's trio, installed
    # here by the development extra, and httpx's command line)
    assert "httpx" in modules and _of(modules, UNUSED) == []


def test_the_server_starts_without_a_sites_modules(tmp_path: Path) -> None:
    """``fedforest server`` up to serving (uvicorn's run, replaced here by a print of the
    modules): the server's modules are in, a site's are not."""
    config = tmp_path / "server.toml"
    config.write_text(f'host = "127.0.0.1"\ndatabase = "sqlite:///{tmp_path / "s.db"}"\n'
                      f'audit_database = "sqlite:///{tmp_path / "audit.db"}"\n')
    code = ("import json, sys, uvicorn\n"
            "def serving(self, sockets=None):\n"
            f"    print({_IMPORTED})\n"
            "uvicorn.Server.run = serving\n"
            "sys.argv = ['fedforest', *sys.argv[1:]]\n"
            "from fedforest_cli.__main__ import main\n"
            "main()\n")
    modules = _imported(code, "server", "--config", str(config), "--insecure-dev",
                        "--port", str(free_port()))
    assert "server_app.app" in modules  # the server was built
    assert _of(modules, NEVER_AT_START) == []
    # nor the optional imports of its libraries that it never uses (FastAPI's of pydantic.v1)
    assert "fastapi" in modules and _of(modules, UNUSED) == []
    assert _of(modules, SITE_ONLY) == []
    assert [m for m in _of(modules, ("client_app",))
            if m not in ("client_app", "client_app.stop")] == []
