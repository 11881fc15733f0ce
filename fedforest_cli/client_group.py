"""Several sites' clients in one process, each a thread of ``client_app.runner.run_client``.

For simulations and benchmarks of many sites on one machine (a deployed site runs its own
``fedforest client`` process):

    python -m fedforest_cli.client_group SPEC.json

``SPEC.json`` is a list of :class:`client_app.runner.ClientOptions` fields, one object per site
(paths as strings). The process prints each site's final status (a line ``site <state_dir name>:
<status> <detail>`` per site that did not end ``done``, with the time it ended) and exits 1
unless every site ends ``done``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: ClientOptions fields that are paths
PATH_FIELDS = ("data", "schema", "ca", "cert", "key", "state_dir", "model_out")


def run_group(spec_path: Path) -> int:
    """Run every site of ``spec_path`` as a thread; 0 if all end ``done``, else 1."""
    from client_app.context import ended
    from client_app.runner import ClientOptions, run_client

    results: list[str] = []
    started = time.monotonic()

    def one(d: dict[str, Any]) -> None:
        paths = {f: Path(d[f]) for f in PATH_FIELDS}
        try:
            res = run_client(ClientOptions(**{**d, **paths}))
            status, detail = res.status, res.detail
        except Exception as exc:  # noqa: BLE001 - reported, and the group exits 1
            status, detail = "error", repr(exc)
        results.append(status)
        if status != "done":
            print(f"site {paths['state_dir'].name}: {ended(status, detail)} (after "
                  f"{time.monotonic() - started:.0f} s)", flush=True)

    threads = [threading.Thread(target=one, args=(d,))
               for d in json.loads(spec_path.read_text())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(results, flush=True)
    return 0 if all(r == "done" for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m fedforest_cli.client_group SPEC.json")
    raise SystemExit(run_group(Path(sys.argv[1])))
