"""The data of a comparison: a CSV table read for ``fedforest compare --csv``, and each seed's
70/30 split with its client partition (:mod:`.compare` trains and scores on it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._cells import _is_missing_cell
from ..tablecheck import line_numbers, read_raw
from .partitions import dirichlet_partition

__all__ = ["load_csv_table"]


@dataclass
class _Split:
    """One seed's training and held-out rows, each with its client code; ``moved``: the codes
    of the sites whose rows were all held out and were moved to the training part."""

    Xtr: np.ndarray
    ytr: np.ndarray
    htr: np.ndarray
    Xte: np.ndarray
    yte: np.ndarray
    hte: np.ndarray
    moved: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def load_csv_table(path: str | Path, target: str, client_column: str | None = None,
                   task: str = "auto") -> tuple[np.ndarray, np.ndarray, np.ndarray | None, str]:
    """Read a CSV with a header: numeric feature columns, a target and optionally a client column.

    Returns ``(X, y, client, task)``. ``task="auto"``: classification if the target is not
    numeric or holds at most 20 distinct integers, else regression. ``client`` holds the client
    column's cells as text, the sites' names (:func:`~.compare.run_comparison` numbers them
    ``0..K-1`` in sorted order). The file is read as the sites' tables are
    (UTF-8 with or without a byte-order mark, blank lines skipped); errors name the file's
    line and column.

    Raises
    ------
    ValueError
        Duplicate column names, a row with another number of cells than the header, a
        missing target or client cell, a feature cell that is no finite number (or beyond
        float32, which the baselines' trees read), no data rows, a target with one class.
    """
    table = read_raw(path)
    names, rows, lines = table.header, table.rows, table.lines
    dups = sorted({c for c in names if names.count(c) > 1})
    if dups:
        raise ValueError(f"{path}: duplicate column names {dups}: rename them so that each "
                         "appears once")
    for name in (target, client_column):
        if name is not None and name not in names:
            raise ValueError(f"{path}: no column {name!r} (columns: {names})")
    ragged = [i for i, r in enumerate(rows) if len(r) != len(names)]
    if ragged:
        raise ValueError(f"{path}: {line_numbers(ragged, lines)} "
                         f"{'do' if len(ragged) > 1 else 'does'} not have {len(names)} cells, "
                         "as the header")
    if not rows:
        raise ValueError(f"{path}: no data rows below the header")
    feats = [c for c in names if c not in (target, client_column)]
    if not feats:
        raise ValueError(f"{path}: no feature columns")
    cells = {c: [r[k] for r in rows] for k, c in enumerate(names)}
    for name, role in ((target, "the target"), (client_column, "the client column")):
        if name is None:
            continue
        empty = [i for i, v in enumerate(cells[name]) if _is_missing_cell(v)]
        if empty:
            shown = ", ".join(map(repr, sorted({cells[name][i] for i in empty})))
            raise ValueError(f"{path}: column {name!r} ({role}) has no value at "
                             f"{line_numbers(empty, lines)} ({shown}): every row needs one")
    X = np.empty((len(rows), len(feats)))
    big = float(np.finfo(np.float32).max)
    for j, c in enumerate(feats):
        for i, v in enumerate(cells[c]):
            try:
                x = float(v)
            except ValueError:
                x = math.nan
            if not (math.isfinite(x) and abs(x) <= big):
                raise ValueError(f"{path}: column {c!r} is not a finite number at "
                                 f"{line_numbers([i], lines)}: {v!r} (feature columns must be "
                                 "numeric and complete: drop or fill such rows)")
            X[i, j] = x
    raw_y = cells[target]
    try:
        y_num: np.ndarray | None = np.array([float(v) for v in raw_y])
    except ValueError:
        y_num = None
    if y_num is not None and not np.isfinite(y_num).all():
        y_num = None  # "nan", "inf": text, as a label
    if task == "auto":
        if y_num is None:
            task = "classification"
        else:
            ints = np.all(y_num == np.round(y_num))
            task = "classification" if ints and np.unique(y_num).size <= 20 else "regression"
    if task == "classification":
        labels, y = np.unique(np.array(raw_y) if y_num is None else y_num, return_inverse=True)
        if labels.size < 2:
            raise ValueError(f"{path}: the target {target!r} has one class ({raw_y[0]!r}): "
                             "a classifier needs at least two")
        y = y.astype(np.int64)
    elif task == "regression":
        if y_num is None:
            raise ValueError(f"{path}: regression target {target!r} must be numeric")
        y = y_num
    else:
        raise ValueError(f"task must be auto, classification or regression, got {task!r}")
    client = None if client_column is None else np.array(cells[client_column], dtype=str)
    return X, y, client, task


def _owner_of(Xtr: np.ndarray, htr: np.ndarray, Xte: np.ndarray) -> np.ndarray:
    """Client of each held-out row: the client of its nearest training row (standardised)."""
    mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    A, B = (Xtr - mu) / sd, (Xte - mu) / sd
    d2 = (B * B).sum(1)[:, None] - 2 * B @ A.T + (A * A).sum(1)[None, :]
    return np.asarray(htr[np.argmin(d2, axis=1)], dtype=np.int64)


def _split(X: np.ndarray, y: np.ndarray, client: np.ndarray | None, task: str, seed: int,
           n_clients: int, alpha: float) -> _Split:
    """Seed ``seed``'s 70/30 split (stratified for classification). With ``client`` (codes),
    every site keeps a training row: a site whose rows all fall in the held-out part has
    them moved to the training part (each site's local forest, and a forest that splits on
    the site, needs its training rows); with none, the training rows are spread over
    ``n_clients`` by a Dirichlet partition and each held-out row gets its nearest training
    row's client.

    Raises
    ------
    ValueError
        Every held-out row belongs to a site without training rows (sites of one row or two).
    """
    from sklearn.model_selection import train_test_split

    idx = np.arange(X.shape[0])
    tr, te = train_test_split(idx, test_size=0.3, random_state=seed,
                              stratify=y if task == "classification" else None)
    if client is not None:
        moved = np.setdiff1d(client[te], client[tr])
        if moved.size:
            back = np.isin(client[te], moved)
            tr, te = np.concatenate([tr, te[back]]), te[~back]
            if not te.size:
                raise ValueError(f"seed {seed}: every held-out row belongs to a site without "
                                 "training rows: the sites have too few rows for a 70/30 "
                                 "split; give each site more rows, or merge the smallest")
        return _Split(X[tr], y[tr], client[tr], X[te], y[te], client[te], moved)
    Xtr, Xte = X[tr], X[te]
    min_size = max(2, min(10, Xtr.shape[0] // (2 * n_clients)))
    htr = dirichlet_partition(Xtr, n_clients, alpha, seed, min_size=min_size)
    return _Split(Xtr, y[tr], htr, Xte, y[te], _owner_of(Xtr, htr, Xte))
