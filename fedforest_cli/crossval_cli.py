"""``fedforest cross-validate``: federated k-fold cross-validation of one hyper-parameter.

    fedforest cross-validate --dataset breast_cancer --param max_depth --values 2,4,6 \\
        --folds 3 --profile secure

Runs :func:`fedforest_secure.evaluation.crossval.cross_validate` in one process (every site a
separate in-process client, the rows never pooled): per fold and value a training through the
real protocol, per fold one evaluation round; prints the cross-validated metric per value and
what the cross-validation cost in privacy.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from fedforest_secure.errors import FedForestError

from ._common import MAX_SEED, console, fail

__all__ = ["cross_validate_cmd", "parse_values"]


def parse_values(text: str) -> list[Any]:
    """``"2,4,6"`` -> ``[2, 4, 6]``; floats, ``none`` and strings as written."""
    out: list[Any] = []
    for raw in text.split(","):
        v = raw.strip()
        if not v:
            continue
        if v.lower() == "none":
            out.append(None)
            continue
        try:
            out.append(int(v))
        except ValueError:
            try:
                out.append(float(v))
            except ValueError:
                out.append(v)
    if not out:
        raise ValueError("--values needs at least one value")
    return out


def cross_validate_cmd(
    param: Annotated[str, typer.Option(help="the hyper-parameter, e.g. max_depth")],
    values: Annotated[str, typer.Option(help="comma-separated candidate values")],
    dataset: Annotated[str, typer.Option(help="dataset name (as for simulate)")] =
    "breast_cancer",
    folds: Annotated[int, typer.Option(help="k")] = 3,
    clients: Annotated[int, typer.Option(min=1, help="sites K (Dirichlet partition)")] = 4,
    alpha: Annotated[float, typer.Option(help="Dirichlet heterogeneity")] = 0.5,
    profile: Annotated[str, typer.Option(help="open | secure | secure-dp | path")] = "secure",
    trees: Annotated[int, typer.Option(help="trees T of every training")] = 20,
    metric: Annotated[str | None, typer.Option(
        help="metric to choose by (default accuracy / r2)")] = None,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED,
                                      help="seed of the partition, folds and forests")] = 0,
) -> None:
    """Federated k-fold cross-validation of one hyper-parameter (in process)."""
    import numpy as np
    from rich.table import Table

    from fedforest_secure.evaluation.crossval import cross_validate

    from .sim_data import _partition, load_table

    try:
        X, y, task, _ = load_table(dataset)
        part = _partition(y, task, clients, alpha, seed)
        sites = [(X[part == k], y[part == k]) for k in range(clients)]
        n_classes = int(np.max(y)) + 1 if task == "classification" else 0
        res = cross_validate(sites, task=task, param=param, values=parse_values(values),
                             folds=folds, metric=metric, profile=profile,
                             params={"n_estimators": trees}, n_classes=n_classes, seed=seed)
    except (FedForestError, ValueError, TypeError) as exc:
        fail(exc)
    table = Table(title=f"{dataset}: {folds}-fold federated cross-validation of {param} "
                        f"({clients} sites, profile {profile})")
    table.add_column(param)
    table.add_column(f"{res.metric} (out-of-fold)", justify="right")
    table.add_column("per fold: mean ± std", justify="right")
    table.add_column("")
    for v in res.values:
        name = f"{param}={v}"
        folds_m = np.asarray(res.per_fold[name], dtype=np.float64)
        table.add_row(str(v), f"{res.cv[name]:.4f}",
                      f"{folds_m.mean():.4f} ± {folds_m.std(ddof=1):.4f}",
                      "best" if v == res.best else "")
    Console(emoji=False).print(table)
    p = res.privacy
    console.print(f"privacy: {p['training_jobs']} trainings and {p['evaluation_rounds']} "
                  f"evaluation rounds; every record is in {p['trainings_per_record']} "
                  f"trainings and {p['evaluation_releases_per_record']} evaluation release")
    if p.get("dp"):
        console.print(f"DP: each training ε={max(p['training_epsilon']):.3g}, the evaluation "
                      f"ε={p['evaluation_epsilon']:.3g}; composed per record (Rényi, one "
                      f"conversion): ε={p['epsilon']:.3f} at δ={p['delta']:g}")
        console.print(f"the scores are computed from noisy sums (not clipped): the {res.metric} "
                      "may leave its usual range; compare the values by their order")
