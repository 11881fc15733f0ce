"""Every server and site process imports the engine: the DP calibration stack (diffprivlib,
which imports much of scikit-learn) is loaded only by the code that calibrates noise."""

from __future__ import annotations

import subprocess
import sys


def test_the_server_and_client_processes_do_not_import_diffprivlib_at_start_up() -> None:
    code = ("import sys, server_app.app, server_app.serve, client_app.runner, "
            "fedforest_secure.coordinator, fedforest_secure.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'diffprivlib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
