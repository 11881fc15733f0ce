"""``fedforest compare``: utility with and without noise, FedForest profiles against central DP
and plain baselines, as a table, a plot (``compare_<name>.png``) and a CSV
(``compare_<name>.csv``) in ``--out``.

``--out`` is checked before the first fit; the two files are rendered in memory and each
replaces the file there only once both are complete, so an interrupted or failed run leaves the
earlier pair as it was.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer

from fedforest_secure.errors import FedForestError

from ._common import console, fail

__all__ = ["check_out_dir", "compare_cmd", "output_stem"]


def output_stem(name: str, metric: str | None) -> str:
    """``compare_<name>``, or ``compare_<name>_<metric>`` for another metric than the task's
    default: known before the run, as each default metric scores one task only (a metric
    that does not fit the task is refused before any fit)."""
    from fedforest_secure.experiments.compare import METRICS

    defaults = {scores[0] for scores in METRICS.values()}
    return f"compare_{name}" if metric is None or metric in defaults else \
        f"compare_{name}_{metric}"


def check_out_dir(out: Path, files: list[Path]) -> None:
    """Exit with an error (code 2) before anything runs when ``files`` cannot be written in
    ``out``: ``out`` (or the nearest of its parents that exists; compare makes the missing
    ones) is no directory or cannot be written, or one of ``files`` is a directory."""
    base = out
    while not (base.exists() or base.is_symlink()) and base != base.parent:
        base = base.parent
    if not base.is_dir():
        what = "is not a directory" if base == out else f"cannot be made: {base} is a file"
        fail(NotADirectoryError(f"--out {out} {what}: name a directory for compare's .png and "
                                ".csv (nothing was run)"))
    if not os.access(base, os.W_OK | os.X_OK):
        fail(PermissionError(f"--out {out}: cannot write in {base} (nothing was run)"))
    for path in files:
        if path.is_dir():
            fail(IsADirectoryError(f"{path} is a directory: compare writes its file there; "
                                   "remove it or choose another --out (nothing was run)"))


def compare_cmd(
    dataset: Annotated[str | None, typer.Option(
        help="dataset name (breast_cancer, wine, diabetes, ...); or use --csv")] = None,
    epsilons: Annotated[str, typer.Option(
        help="comma-separated DP budgets; inf = the column of the methods without DP")
    ] = "0.5,1,2,4,8,inf",
    seeds: Annotated[int, typer.Option(min=1, help="repetitions (seeds 0..n-1)")] = 5,
    clients: Annotated[int, typer.Option(min=1, help="clients K of the Dirichlet partition")] = 4,
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration")] = 1.0,
    out: Annotated[Path, typer.Option(help="directory for compare_<name>.png / .csv")
                   ] = Path("docs"),
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="a CSV table instead of --dataset")] = None,
    target: Annotated[str | None, typer.Option(help="target column of --csv")] = None,
    client_column: Annotated[str | None, typer.Option(
        help="client column of --csv (its clients replace the Dirichlet partition)")] = None,
    task: Annotated[str, typer.Option(
        help="auto | classification | regression (for --csv)")] = "auto",
    metric: Annotated[str | None, typer.Option(
        help="balanced_accuracy (default) or accuracy for classification; r2 for regression. "
             "Another metric than the default writes compare_<name>_<metric>.png / .csv")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="no per-fit progress lines")] = False,
) -> None:
    """Utility with and without noise: FedForest profiles vs central DP and plain baselines."""
    from rich.console import Console as _Console

    from fedforest_secure.experiments.compare import (
        csv_text,
        load_csv_table,
        parse_epsilons,
        run_comparison,
    )
    from fedforest_secure.files import replacing

    from .compare_view import format_table, render

    if csv_path is not None:
        if target is None:
            fail(ValueError("--csv needs --target"))
        name = csv_path.stem
    elif dataset is not None:
        name = dataset
    else:
        fail(ValueError("give --dataset NAME or --csv FILE --target COL"))
    stem = output_stem(name, metric)
    png_file, csv_file = out / f"{stem}.png", out / f"{stem}.csv"
    check_out_dir(out, [png_file, csv_file])
    progress = None if quiet else console.print
    try:
        eps = parse_epsilons(epsilons)
        if csv_path is not None:
            data = load_csv_table(csv_path, str(target), client_column, task)
            res = run_comparison(data=data, name=name, epsilons=eps, seeds=seeds,
                                 n_clients=clients, alpha=alpha, metric=metric,
                                 progress=progress)
        else:
            res = run_comparison(dataset, epsilons=eps, seeds=seeds, n_clients=clients,
                                 alpha=alpha, metric=metric, progress=progress)
        png, text = render(res, "png"), csv_text(res)
        out.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as both:  # renamed over the old files once both are whole
            both.enter_context(replacing(png_file)).write_bytes(png)
            both.enter_context(replacing(csv_file)).write_bytes(text.encode("utf-8"))
    except (FedForestError, ValueError, OSError) as exc:
        fail(exc)
    out_console = _Console(emoji=False)
    out_console.width = max(out_console.width, 132)
    out_console.print(format_table(res))
    for note in res.settings.get("notes", []):
        console.print(f"note: {note}", markup=False)
    console.print(f"wrote {png_file} and {csv_file}", markup=False)
