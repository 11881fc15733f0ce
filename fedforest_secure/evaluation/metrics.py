"""Metrics from summed statistics (server side): the same numbers scikit-learn computes on the
pooled rows.

Every function takes one model's statistics (the blocks of :mod:`.layout`, summed over sites)
and never sees a row. With exact sums the results equal scikit-learn's on the pooled held-out
rows (``tests/test_evaluation_metrics.py``): accuracy, balanced accuracy, macro precision /
recall / F1 (``zero_division=0``), log-loss, Brier score, calibration curve to 1e-9; R^2, MSE,
MAE within the rounding of the sums' encoding (:mod:`.encoding`), which scales with the
target range ``r``: MSE within ``sites / rows * r^2 * 2^-41``, MAE and the mean error within
``sites / rows * r * 2^-41``, R^2 within ``sites / rows * r^2 / var(y) * 2^-40`` (R^2 above
-1/3). ROC AUC and average precision are those of the scores binned into the ``G`` score
bins (scikit-learn's on the pooled bin indices, to 1e-9); the AUC of the unbinned scores
differs from it by at most :func:`auc_binning_bound` (pairs of a positive and a negative row in
one bin count as ties), their average precision by at most
:func:`average_precision_binning_bound` (the order of the rows inside each bin is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .layout import EvalLayout

__all__ = ["CLASSIFICATION_METRICS", "REGRESSION_METRICS", "auc_binning_bound",
           "average_precision_binning_bound", "binned_auc", "binned_average_precision",
           "calibration_curve", "classification_metrics", "metrics", "predicted_vs_actual",
           "regression_metrics", "roc_curve"]

#: the names :func:`classification_metrics` returns, in its order
CLASSIFICATION_METRICS = ("n", "accuracy", "balanced_accuracy", "precision_macro",
                          "recall_macro", "f1_macro", "log_loss", "brier", "roc_auc",
                          "average_precision", "roc_auc_binning_bound",
                          "average_precision_binning_bound", "ece")
#: the names :func:`regression_metrics` returns, in its order
REGRESSION_METRICS = ("n", "r2", "mse", "rmse", "mae", "mean_error")

_Stats = Mapping[str, np.ndarray]


def _div(a: float, b: float) -> float:
    return a / b if b != 0 else float("nan")


def _per_row(total: float, n: float) -> float:
    """A sum over rows divided by their number; undefined (NaN) unless the number, which
    carries noise under DP, is positive."""
    return total / n if n > 0 else float("nan")


def binned_auc(neg: np.ndarray, pos: np.ndarray) -> float:
    """ROC AUC of binned scores (ties within a bin count one half), from the counts of negative
    and positive rows per bin (bins in increasing score order)."""
    neg = np.rint(neg).astype(np.int64)  # counts (noisy ones are integers too)
    pos = np.rint(pos).astype(np.int64)
    P, N = int(pos.sum()), int(neg.sum())
    if P <= 0 or N <= 0:
        return float("nan")
    above = np.concatenate([np.cumsum(pos[::-1])[::-1][1:], [0]])  # positives in higher bins
    num = sum(int(n) * (2 * int(a) + int(p)) for n, a, p in zip(neg, above, pos, strict=True))
    return num / (2 * P * N)


def auc_binning_bound(neg: np.ndarray, pos: np.ndarray) -> float:
    """Largest difference between :func:`binned_auc` and the AUC of the unbinned scores: half
    the share of (positive, negative) pairs that fall in one bin."""
    neg, pos = np.clip(neg, 0, None), np.clip(pos, 0, None)
    P, N = float(pos.sum()), float(neg.sum())
    if P <= 0 or N <= 0:
        return float("nan")
    return float(0.5 * (neg * pos).sum() / (P * N))


def roc_curve(neg: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(fpr, tpr)`` at every bin edge, from (0, 0) to (1, 1): the rows in a bin and above
    are called positive."""
    tp = np.concatenate([[0.0], np.cumsum(pos[::-1])])
    fp = np.concatenate([[0.0], np.cumsum(neg[::-1])])
    P, N = tp[-1], fp[-1]
    return (fp / N if N > 0 else fp * np.nan), (tp / P if P > 0 else tp * np.nan)


def binned_average_precision(neg: np.ndarray, pos: np.ndarray) -> float:
    """Average precision of binned scores (scikit-learn's step-wise sum over thresholds)."""
    P = float(pos.sum())
    if P <= 0:
        return float("nan")
    tp = np.cumsum(pos[::-1])
    fp = np.cumsum(neg[::-1])
    called = tp + fp
    keep = called > 0
    precision = np.where(keep, tp / np.where(keep, called, 1.0), 0.0)
    recall_gain = pos[::-1] / P
    return float((recall_gain * precision).sum())


def average_precision_binning_bound(neg: np.ndarray, pos: np.ndarray) -> float:
    """Largest difference between :func:`binned_average_precision` and the average precision
    of the unbinned scores, over every order (and tie) of the rows inside each bin.

    Average precision is the mean, over positive rows, of the precision at the threshold of
    the row's score. Take a bin with ``p`` positive and ``q`` negative rows below ``A``
    positive of ``C`` rows in higher bins. Binned, each of its positives gets ``(A + p) /
    (C + p + q)``. Unbinned, the positive ranked ``k``-th of the bin's ``p`` sees at least
    its ``k`` positives and at most all ``q`` negatives of the bin, so its precision is at
    least ``(A + k) / (C + k + q)`` (all the bin's negatives score above its positives), and
    at most ``(A + p) / (C + p)`` (the bin's positives tie above its negatives). Summed over
    the bin's positives and divided by all ``P`` positives, the two orders bound the
    difference on each side; the bins' orders are independent, so the bound is the larger
    side's sum over bins, and some unbinned scores reach it. (The ROC AUC's bound, half the
    share of a bin's pairs, does not cover this: a bin's order moves the precision of every
    later positive.)"""
    # imported here: a server imports this module at start, scipy only when it scores a job
    from scipy.special import digamma

    neg = np.clip(np.asarray(neg, dtype=np.float64), 0, None)[::-1]  # highest bin first
    pos = np.clip(np.asarray(pos, dtype=np.float64), 0, None)[::-1]
    P = float(pos.sum())
    if P <= 0:
        return float("nan")
    A = np.cumsum(pos) - pos  # positives in higher bins
    C = A + np.cumsum(neg) - neg  # rows in higher bins
    has = pos > 0
    p, q, A, C = pos[has], neg[has], A[has], C[has]
    binned = p * (A + p) / (C + p + q)
    highest = p * (A + p) / (C + p)
    # sum over k = 1..p of (A + k) / (D + k) = p - (D - A) (digamma(D + p + 1) - digamma(D + 1))
    D = C + q
    lowest = p - (D - A) * (digamma(D + p + 1.0) - digamma(D + 1.0))
    return float(max((highest - binned).sum(), (binned - lowest).sum(), 0.0) / P)


def calibration_curve(counts: np.ndarray, prob: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(prob_true, prob_pred, rows)`` of the non-empty bins (scikit-learn's
    ``calibration_curve`` with uniform bins), from per-bin (rows, positives) and the per-bin
    sums of the predicted probability."""
    total, positives = counts[:, 0], counts[:, 1]
    keep = total > 0
    return positives[keep] / total[keep], prob[keep] / total[keep], total[keep]


def classification_metrics(stats: _Stats, layout: EvalLayout) -> dict[str, float]:
    """Accuracy, balanced accuracy, macro precision / recall / F1, log-loss, Brier, ROC AUC,
    average precision, expected calibration error (one model's summed statistics)."""
    cm = np.asarray(stats["confusion"], dtype=np.float64)
    n = float(cm.sum())
    support = cm.sum(axis=1)
    called = cm.sum(axis=0)
    diag = np.diag(cm)
    present = (support > 0) | (called > 0)  # scikit-learn's labels: in y_true or y_pred
    recall = np.where(support > 0, diag / np.where(support > 0, support, 1.0), 0.0)
    precision = np.where(called > 0, diag / np.where(called > 0, called, 1.0), 0.0)
    denom = precision + recall
    f1 = np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1.0), 0.0)
    out = {
        "n": n,
        "accuracy": _per_row(float(diag.sum()), n),
        "balanced_accuracy": float(recall[support > 0].mean()) if (support > 0).any()
        else float("nan"),
        "precision_macro": float(precision[present].mean()) if present.any() else float("nan"),
        "recall_macro": float(recall[present].mean()) if present.any() else float("nan"),
        "f1_macro": float(f1[present].mean()) if present.any() else float("nan"),
        "log_loss": _per_row(float(stats["log_loss"].reshape(-1)[0]), n),
        "brier": _per_row(float(stats["brier"].reshape(-1)[0]), n)
        * (0.5 if layout.n_classes < 3 else 1.0),
    }
    scores = np.asarray(stats["scores"], dtype=np.float64)
    aucs = [binned_auc(s[:, 0], s[:, 1]) for s in scores]
    aps = [binned_average_precision(s[:, 0], s[:, 1]) for s in scores]
    bounds = [auc_binning_bound(s[:, 0], s[:, 1]) for s in scores]
    ap_bounds = [average_precision_binning_bound(s[:, 0], s[:, 1]) for s in scores]
    out["roc_auc"] = _nanmean(aucs)
    out["average_precision"] = _nanmean(aps)
    out["roc_auc_binning_bound"] = _nanmean(bounds)
    out["average_precision_binning_bound"] = _nanmean(ap_bounds)
    eces = []
    for counts, prob in zip(stats["calib_counts"], stats["calib_prob"], strict=True):
        t, p, rows = calibration_curve(np.asarray(counts), np.asarray(prob))
        total = float(rows.sum())
        eces.append(float((rows * np.abs(t - p)).sum() / total) if total > 0 else float("nan"))
    out["ece"] = _nanmean(eces)
    return out


def _nanmean(values: list[float]) -> float:
    good = [v for v in values if not math.isnan(v)]
    return float(np.mean(good)) if good else float("nan")


def regression_metrics(stats: _Stats, layout: EvalLayout, sites: int | None = None
                       ) -> dict[str, float]:
    """R^2, MSE, RMSE, MAE and the mean error (bias, mean of yhat - y) of one model.

    R^2 follows scikit-learn's ``r2_score``: NaN for fewer than two rows; for targets without
    spread (total sum of squares 0) 1.0 if every prediction is exact, else 0.0. The total sum
    of squares is rebuilt from two fixed-point sums, each rounded by up to ``bound 2^-41`` per
    site (:mod:`.encoding`): a total within that rounding (:func:`_sst_rounding`) counts as 0,
    and so does a squared error within its own. ``sites``: the sites whose sums are in
    ``stats`` (at most the rows when not given)."""
    def one(name: str) -> float:
        return float(np.asarray(stats[name]).reshape(-1)[0])

    n = one("count")
    sq, sy, syy = one("sq_err"), one("y"), one("y_sq")
    mse = _per_row(sq, n)
    return {"n": n, "r2": _r2(layout, n, sq, sy, syy, sites),
            "mse": mse, "rmse": math.sqrt(mse) if mse >= 0 else float("nan"),
            "mae": _per_row(one("abs_err"), n), "mean_error": _per_row(one("err"), n)}


def _r2(layout: EvalLayout, n: float, sq: float, sy: float, syy: float,
        sites: int | None) -> float:
    if not n >= 2:
        return float("nan")
    sst = syy - sy * sy / n
    k = float(sites) if sites is not None else n
    sst_err, sq_err = _sst_rounding(layout, n, k)
    if abs(sst) <= sst_err:
        return 1.0 if abs(sq) <= sq_err else 0.0
    return 1.0 - sq / sst


def _sst_rounding(layout: EvalLayout, n: float, sites: float) -> tuple[float, float]:
    """Bounds on the error of the rebuilt total sum of squares ``syy - sy^2 / n`` and of the
    squared-error sum, over ``sites`` sites and ``n`` rows (``h``: half the target range).
    Each site rounds ``sum (y - mid)^2`` (bound ``h^2``) and ``sum (y - mid)`` (bound ``h``)
    to ``bound 2^-41``: ``syy`` is off by at most ``sites h^2 2^-41``, ``sy`` by
    ``e = sites h 2^-41``, so ``sy^2 / n`` (``|sy| <= n h``) by ``2 h e + e^2 / n``; float64
    arithmetic on sums up to ``n h^2`` (the sites' sums of rows and the subtraction) adds a few
    ulps of ``n h^2``, bounded by ``n h^2 2^-45``. The squared errors (bound ``4 h^2``) round
    to ``sites 4 h^2 2^-41`` plus the same float64 share."""
    lo, hi = layout.target_range
    h2 = ((hi - lo) / 2.0) ** 2
    e = sites * math.sqrt(h2) * 2.0 ** -41
    ulps = n * h2 * 2.0 ** -45
    sst_err = sites * h2 * 2.0 ** -41 + 2.0 * math.sqrt(h2) * e + e * e / n + ulps
    return sst_err, sites * 4.0 * h2 * 2.0 ** -41 + 4.0 * ulps


def predicted_vs_actual(stats: _Stats, layout: EvalLayout
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean prediction, mean target, rows)`` per non-empty prediction bin."""
    mid = sum(layout.target_range) / 2.0
    rows = np.asarray(stats["pva_counts"], dtype=np.float64)
    keep = rows > 0
    return (np.asarray(stats["pva_pred"])[keep] / rows[keep] + mid,
            np.asarray(stats["pva_y"])[keep] / rows[keep] + mid, rows[keep])


def metrics(stats: _Stats, layout: EvalLayout, sites: int | None = None) -> dict[str, float]:
    """The metrics of one model's summed statistics, for the layout's task (``sites``: the
    sites whose sums they are, see :func:`regression_metrics`)."""
    if layout.task == "classification":
        return classification_metrics(stats, layout)
    return regression_metrics(stats, layout, sites)
