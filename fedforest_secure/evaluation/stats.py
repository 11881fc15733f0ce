"""One site's evaluation statistics: the sums of :mod:`.layout` over its held-out rows.

Runs at the site, on its own rows; nothing here leaves the site except through
:mod:`.encoding` (and the secure sum).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model import ForestModel
from .layout import EvalLayout

__all__ = ["bin_index", "model_statistics", "site_statistics"]


def bin_index(values: np.ndarray, n_bins: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """Equal bins of [lo, hi] with scikit-learn's ``calibration_curve`` edges: bin ``b`` holds
    ``edges[b] < v <= edges[b + 1]`` (the first bin also ``v <= edges[1]``, the last ``v >
    edges[-2]``)."""
    edges = np.linspace(lo, hi, n_bins + 1)
    return np.searchsorted(edges[1:-1], values).astype(np.int64)


def _classification(layout: EvalLayout, proba: np.ndarray, y: np.ndarray
                    ) -> dict[str, np.ndarray]:
    C = layout.n_classes
    yi = y.astype(np.int64)
    n = yi.size
    rows = np.arange(n)
    pred = np.argmax(proba, axis=1)
    confusion = np.zeros((C, C))
    np.add.at(confusion, (yi, pred), 1.0)
    roc = layout.roc_classes
    G, Bc = layout.score_bins, layout.calibration_bins
    scores = np.zeros((len(roc), G, 2))
    calib_counts = np.zeros((len(roc), Bc, 2))
    calib_prob = np.zeros((len(roc), Bc))
    for i, c in enumerate(roc):
        p = proba[:, c]
        pos = (yi == c).astype(np.int64)
        np.add.at(scores[i], (bin_index(p, G), pos), 1.0)
        cb = bin_index(p, Bc)
        np.add.at(calib_counts[i, :, 0], cb, 1.0)
        np.add.at(calib_counts[i, :, 1], cb, pos.astype(np.float64))
        np.add.at(calib_prob[i], cb, np.clip(p, 0.0, 1.0))
    floor = layout.log_loss_floor
    p_true = np.clip(proba[rows, yi], floor, 1.0 - floor)
    bound = layout.block("log_loss").bound
    log_loss = np.clip(-np.log(p_true), 0.0, bound).sum()
    onehot = np.zeros_like(proba)
    onehot[rows, yi] = 1.0
    brier = np.clip(((onehot - proba) ** 2).sum(axis=1), 0.0, 2.0).sum()
    return {"confusion": confusion, "scores": scores, "calib_counts": calib_counts,
            "calib_prob": calib_prob, "log_loss": np.array([log_loss]),
            "brier": np.array([brier])}


def _regression(layout: EvalLayout, pred: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    lo, hi = layout.target_range
    mid = (lo + hi) / 2.0
    yy = np.clip(y.astype(np.float64), lo, hi)
    yh = np.clip(pred.astype(np.float64), lo, hi)
    err = yh - yy
    yc = yy - mid
    P = layout.pva_bins
    b = bin_index(yh, P, lo, hi)
    pva_counts = np.bincount(b, minlength=P).astype(np.float64)
    pva_y = np.bincount(b, weights=yc, minlength=P)
    pva_pred = np.bincount(b, weights=yh - mid, minlength=P)
    return {"count": np.array([float(yy.size)]), "err": np.array([err.sum()]),
            "sq_err": np.array([(err * err).sum()]), "abs_err": np.array([np.abs(err).sum()]),
            "y": np.array([yc.sum()]), "y_sq": np.array([(yc * yc).sum()]),
            "pva_counts": pva_counts, "pva_y": pva_y, "pva_pred": pva_pred}


def model_statistics(layout: EvalLayout, values: np.ndarray, y: np.ndarray
                     ) -> dict[str, np.ndarray]:
    """One model's statistics from its predictions on the site's rows.

    Parameters
    ----------
    layout : the evaluation's layout
    values : ndarray of shape (n, C) (class probabilities) or (n, 1) / (n,) (regression)
    y : ndarray of shape (n,), class codes or targets
    """
    values = np.asarray(values, dtype=np.float64)
    if layout.task == "classification":
        return _classification(layout, values.reshape(len(y), layout.n_classes), np.asarray(y))
    return _regression(layout, values.reshape(-1), np.asarray(y))


def site_statistics(layout: EvalLayout, forests: Sequence[ForestModel], X: np.ndarray,
                    y: np.ndarray) -> dict[str, np.ndarray]:
    """Every model's statistics on one site's rows, already encoded with the job's schema
    (categorical levels as codes): each block with a leading model axis."""
    per = [model_statistics(layout, f.outputs_of(X), y) for f in forests]
    return {b.name: np.stack([s[b.name].reshape(b.shape) for s in per])
            for b in layout.blocks}
