"""Wall time and peak memory of FedForest ``fit`` against scikit-learn's random forest.

Each measurement runs in a fresh child process, and the contenders alternate within one run,
since these machines are shared and noisy: compare the ratios, not the absolute seconds.
Besides wall time, each fit's CPU time (user + system, all threads) is printed: on a loaded
machine the CPU ratio of single-threaded contenders is the steadier number. Memory is printed
twice: ``peak MiB`` is the child process's peak RSS (the interpreter and its imports, about
150 MiB, included), ``fit MiB`` what the fit added to it: the peak RSS during the fit less the
RSS just before it (Linux; the peak is reset before the fit), imports the fit makes on its
first call included unless ``--warm-up``. The line ``measured`` names the package the children
imported and its commit (the environment's install, not necessarily this script's checkout).

    python benchmarks/speed.py                      # n = 10k, 100k (default)
    python benchmarks/speed.py --sizes 10000 100000 1000000 --repeat 3
    python benchmarks/speed.py --contenders open secure secure-plain --sizes 10000
    python benchmarks/speed.py --contenders sklearn open sklearn-2 open-2 --sizes 100000
    python benchmarks/speed.py --sizes 1000000 --trees 5      # per-tree cost at n = 1M
    python benchmarks/speed.py --sizes 10000 --warm-up        # start-up left out

Contenders: ``sklearn`` (RandomForestRegressor, n_jobs=1), ``open`` (FedForest, in process,
open profile), ``secure`` (secure profile: masking + secure CDF sketch) and ``secure-plain``
(the same profile with ``secure_aggregation = false``: identical forest, no masks). A suffix
``-N`` runs a contender with ``n_jobs=N`` (``sklearn-2``, ``open-2``): its ratio is printed
against the first contender and against ``sklearn-N`` when that runs too. A suffix ``-numpy``
runs a FedForest contender without its compiled loops (``FEDFOREST_NUMPY_KERNELS=1``: the
same forest, from the numpy code), e.g. ``open-numpy`` or ``open-numpy-2``.
Data: synthetic regression, d = 20, K = 10 clients, T = 50, depth 8, min leaf 5, d/3 features.
``--trees`` changes T (scikit-learn's cost grows linearly in T; FedForest's has a part per
fit that does not, its rounds being batched over all trees, so its ratio at fewer trees is
above the one at T = 50). ``--warm-up`` fits each contender once on other rows first, so
per-process start-up (imports, first-call set-up) is left out of the measured fit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from _cli import at_least

#: the contenders by name, before a ``-numpy`` and a ``-N`` suffix
CONTENDERS = ("sklearn", "open", "secure", "secure-plain")


def _data(n: int, d: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + np.sin(2 * X[:, 1]) + X[:, 2] * X[:, 3] + 0.3 * rng.normal(size=n)
    h = rng.integers(0, k, n)
    return X, y, h


def _split(contender: str) -> tuple[str, int]:
    """``"open-2"`` -> ``("open", 2)``, ``"secure-plain-2"`` -> ``("secure-plain", 2)``; no
    suffix: one job."""
    name, _, jobs = contender.rpartition("-")
    if name and jobs.isdigit():
        return name, int(jobs)
    return contender, 1


def _contender(text: str) -> str:
    """An argparse ``type``: a contender's name, with its suffixes, checked before anything
    runs."""
    name, n_jobs = _split(text)
    numpy = name.endswith("-numpy")
    name = name.removesuffix("-numpy")
    if name not in CONTENDERS or n_jobs < 1 or (numpy and name == "sklearn"):
        raise argparse.ArgumentTypeError(
            f"unknown contender {text!r}: choose from {', '.join(CONTENDERS)}, with an "
            "optional suffix -N (n_jobs = N >= 1) and, for FedForest, -numpy before it "
            "(open-numpy-2)")
    return text


def _child(contender: str, n: int, trees: int, depth: int, warm_up: bool, d: int = 20
           ) -> None:
    X, y, h = _data(n, d, 10)
    if "-numpy" in contender:  # read when fedforest_secure is first imported, below
        os.environ["FEDFOREST_NUMPY_KERNELS"] = "1"
        contender = contender.replace("-numpy", "")
    name, n_jobs = _split(contender)
    if name == "sklearn":
        from sklearn.ensemble import RandomForestRegressor

        def fit(X: np.ndarray, y: np.ndarray, h: np.ndarray) -> None:
            RandomForestRegressor(n_estimators=trees, max_depth=depth, min_samples_leaf=5,
                                  max_features=1 / 3, n_jobs=n_jobs, random_state=0).fit(X, y)
    else:
        from fedforest_secure import FedForestRegressor, load_profile

        profile = {"open": "open", "secure": "secure",
                   "secure-plain": load_profile("secure", secure_aggregation=False)}[name]

        def fit(X: np.ndarray, y: np.ndarray, h: np.ndarray) -> None:
            FedForestRegressor(n_estimators=trees, max_depth=depth, min_samples_leaf=5,
                               max_features=1 / 3, profile=profile, random_state=0,
                               n_jobs=n_jobs).fit(X, y, client=h)

    if warm_up:  # one unmeasured fit on 1,000 other rows: per-process start-up left out
        fit(*_data(1000, d, 10, seed=1))
    before = _rss_before_fit()
    cpu0 = _cpu()
    t0 = time.perf_counter()
    fit(X, y, h)
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    peak = usage.ru_maxrss / 1024
    fit_peak = _status_mib("VmHWM")
    package = sys.modules.get("fedforest_secure")
    print(json.dumps({"seconds": seconds, "peak_mib": peak, "cpu": cpu,
                      "fit_mib": (fit_peak if fit_peak is not None and before is not None
                                  else peak) - (before if before is not None else 0.0),
                      "package": None if package is None or package.__file__ is None
                      else os.path.dirname(os.path.abspath(package.__file__))}))


def _rss_before_fit() -> float | None:
    """Reset this process's peak RSS to its current RSS (Linux: ``/proc/self/clear_refs``)
    and return that RSS in MiB; None where the peak cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_mib("VmRSS")


def _status_mib(field: str) -> float | None:
    """A ``kB`` field of ``/proc/self/status`` in MiB, None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure(contender: str, n: int, trees: int, depth: int, warm_up: bool, d: int = 20
             ) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", contender, "--sizes", str(n),
                          "--trees", str(trees), "--depth", str(depth), "--features", str(d)]
                         + (["--warm-up"] if warm_up else []),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"error: the fit of contender {contender} at n = {n} failed (exit "
                         f"code {out.returncode}); its output:\n{out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--contenders", type=_contender, nargs="+", default=["sklearn", "open"],
                    help=f"from {', '.join(CONTENDERS)}; a suffix -N: n_jobs = N; -numpy "
                         "(FedForest only): without its compiled loops")
    ap.add_argument("--repeat", type=at_least(1), default=1)
    ap.add_argument("--trees", type=int, default=50)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--features", type=at_least(4), default=20,
                    help="d, the columns of the synthetic data (the target uses the first 4)")
    ap.add_argument("--warm-up", action="store_true",
                    help="each child first fits its contender once on 1,000 other rows, "
                         "unmeasured: per-process start-up (FedForest: loading its compiled "
                         "loops) is left out")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.sizes[0], args.trees, args.depth, args.warm_up, args.features)
        return
    base = args.contenders[0]
    print(f"T={args.trees} depth={args.depth} d={args.features} K=10; median of {args.repeat}; "
          f"ratios against {base}; {'after a warm-up fit; ' if args.warm_up else ''}"
          f"script {_state()}; load {_load()}")
    print(f"{'n':>9} {'contender':>13} {'seconds':>9} {'cpu s':>8} {'peak MiB':>9} "
          f"{'fit MiB':>8} {'time x':>7} {'cpu x':>6} {'peak x':>7} {'fit mem x':>9}")
    packages: set[str] = set()
    for n in args.sizes:
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in args.contenders}
        for _ in range(args.repeat):
            for c in args.contenders:  # alternate contenders within each repetition
                runs[c].append(_measure(c, n, args.trees, args.depth, args.warm_up,
                                        args.features))
                if runs[c][-1].get("package"):
                    packages.add(runs[c][-1]["package"])
        med = {c: {k: statistics.median(r[k] for r in runs[c])
                   for k in ("seconds", "cpu", "peak_mib", "fit_mib")} for c in args.contenders}
        for c in args.contenders:
            m, b = med[c], med[base]
            fit_x = f"{m['fit_mib'] / b['fit_mib']:>9.2f}" if b["fit_mib"] > 0 else f"{'-':>9}"
            print(f"{n:>9} {c:>13} {m['seconds']:>9.2f} {m['cpu']:>8.2f} "
                  f"{m['peak_mib']:>9.0f} {m['fit_mib']:>8.0f} "
                  f"{m['seconds'] / b['seconds']:>7.2f} {m['cpu'] / b['cpu']:>6.2f} "
                  f"{m['peak_mib'] / b['peak_mib']:>7.2f} {fit_x}", flush=True)
        for c in args.contenders[1:]:  # each repetition's own ratio (neighbours' load varies)
            refs = [base]
            name, n_jobs = _split(c)
            twin = f"sklearn-{n_jobs}"
            if name != "sklearn" and n_jobs > 1 and twin in runs and twin != base:
                refs.append(twin)
            for ref in refs:
                per = " ".join(f"{a['seconds'] / b['seconds']:.2f}"
                               for a, b in zip(runs[c], runs[ref], strict=True))
                print(f"{'':>9} {c:>13} time x per repetition (vs {ref}): {per}", flush=True)
    for package in sorted(packages):
        print(f"measured: fedforest_secure from {package} ({_state(package)})")
    print(f"load at the end {_load()}")


def _load() -> str:
    """The 1, 5 and 15 minute load averages (the machine is shared: report them)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _state(where: str | None = None) -> str:
    """The commit of the checkout holding ``where`` (default: this script), with '+dirty'
    when its working tree has changes."""
    here = where or os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty=+dirty"], cwd=here,
                             capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    return f"commit {out.stdout.strip()}"


if __name__ == "__main__":
    main()
