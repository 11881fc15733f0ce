"""What ``fedforest evaluate`` shows: an evaluation's metrics as a table and its curves as a plot.

The numbers come from an :class:`~fedforest_secure.evaluation.result.EvalResult` (an evaluation
job's output); this module only draws them. A row per (metric, model): the value, the standard
deviation the evaluation's own DP noise gives it (DP evaluations), and the difference to a
reference model (by default the first: e.g. a model trained without noise, next to the same
federation's model trained with it).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from rich.table import Table

from fedforest_secure.evaluation.result import EvalResult

__all__ = ["METRICS", "plot", "rows", "to_markdown", "to_table"]

#: The metrics shown, in order, per task (label, higher is better).
METRICS: dict[str, list[tuple[str, str]]] = {
    "classification": [("accuracy", "accuracy"), ("balanced_accuracy", "balanced accuracy"),
                       ("f1_macro", "F1 (macro)"), ("roc_auc", "ROC AUC"),
                       ("average_precision", "average precision"), ("log_loss", "log-loss"),
                       ("brier", "Brier score"), ("ece", "calibration error (ECE)")],
    "regression": [("r2", "R²"), ("rmse", "RMSE"), ("mae", "MAE"),
                   ("mean_error", "mean error (bias)")],
}


def _fmt(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{v:.4f}"


def rows(res: EvalResult, reference: str | None = None) -> list[list[str]]:
    """``[metric, model, value, ± noise, Δ vs reference]`` per metric and model."""
    ref = res.model(reference) if reference is not None else res.models[0]
    out = []
    for key, label in METRICS[res.task]:
        for m in res.models:
            v = m.metrics.get(key, float("nan"))
            noise = m.noise_std.get(key)
            delta = "—" if m is ref else _signed(v - ref.metrics.get(key, float("nan")))
            out.append([label, m.name, _fmt(v), "—" if noise is None else f"± {_fmt(noise)}",
                        delta])
    return out


def _signed(v: float) -> str:
    return "—" if math.isnan(v) else f"{v:+.4f}"


def _title(res: EvalResult, reference: str | None) -> str:
    ref = reference or res.models[0].name
    n = int(res.models[0].metrics.get("n", 0) or 0)
    noise = (f"; DP evaluation (ε={res.dp['epsilon']:g}), ± = noise std"
             if res.dp else "; exact sums")
    # under DP the row count is a noisy sum as well: a figure of the release, not a fact
    rows = f"about {n} (noisy)" if res.dp else f"{n}"
    return (f"{res.job_id}: {len(res.models)} model(s) on {rows} held-out rows of "
            f"{res.contributors} sites{noise}; Δ vs {ref}")


def to_table(res: EvalResult, reference: str | None = None) -> Table:
    """A :class:`rich.table.Table` of :func:`rows`."""
    table = Table(title=_title(res, reference))
    for col, just in (("metric", "left"), ("model", "left"), ("value", "right"),
                      ("± eval noise", "right"), ("Δ", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows(res, reference):
        table.add_row(*r)
    return table


def to_markdown(res: EvalResult, reference: str | None = None) -> str:
    """The same table in Markdown (for docs)."""
    ref = reference or res.models[0].name
    lines = [f"| metric | model | value | ± eval noise | Δ vs {ref} |",
             "|---|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(res, reference)]
    return "\n".join(lines) + "\n"


def _class_name(res: EvalResult, key: str) -> str:
    """``class <label>`` of a curve's key (a class index); ``schema class <index>`` for a
    result without labels (the index counts the schema's classes, not the sorted ones)."""
    label = res.class_label(key)
    return f"class {label}" if label is not None else f"schema class {key}"


def plot(res: EvalResult, path: str | Path) -> Path:
    """ROC and calibration curves per model (classification; the positive class of two, every
    class of more, each named by its label where the result has them), or predicted-vs-actual
    bins per model (regression), written to ``path`` (its directory must exist)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if res.task == "regression":
        fig, ax = plt.subplots(figsize=(5.5, 5))
        lo = hi = None
        for m in res.models:
            pva = m.curves.get("pva", {})
            pred = [v for v in pva.get("pred", []) if v is not None]
            actual = [v for v in pva.get("actual", []) if v is not None]
            if len(pred) != len(actual) or not pred:
                continue
            ax.plot(pred, actual, "o-", label=f"{m.name} (R² {_fmt(m.metrics['r2'])})")
            lo = min([*pred, *actual] + ([lo] if lo is not None else []))
            hi = max([*pred, *actual] + ([hi] if hi is not None else []))
        if lo is not None and hi is not None:
            ax.plot([lo, hi], [lo, hi], "k:", lw=1, label="ideal")
        ax.set_xlabel("mean prediction in bin")
        ax.set_ylabel("mean target in bin")
        ax.set_title("predicted vs actual (federated)")
        ax.legend(fontsize=8)
    else:
        fig, (roc_ax, cal_ax) = plt.subplots(1, 2, figsize=(10, 4.6))
        positive = ""
        for m in res.models:
            for cls, curve in m.curves.get("roc", {}).items():
                one = len(m.curves["roc"]) == 1
                suffix = "" if one else f", {_class_name(res, cls)}"
                if one:
                    positive = _class_name(res, cls)
                # one class against the rest: that curve's own area (the metric is the macro
                # average); the area under the binned curve is the binned AUC, ties as half
                auc = m.metrics["roc_auc"] if one else float(np.trapezoid(
                    np.asarray(curve["tpr"], dtype=float), np.asarray(curve["fpr"], dtype=float)))
                roc_ax.plot(curve["fpr"], curve["tpr"], label=f"{m.name}{suffix} (AUC {_fmt(auc)})")
            for cls, curve in m.curves.get("calibration", {}).items():
                suffix = ("" if len(m.curves["calibration"]) == 1
                          else f", {_class_name(res, cls)}")
                cal_ax.plot(curve["prob_pred"], curve["prob_true"], "o-",
                            label=f"{m.name}{suffix}")
        roc_ax.plot([0, 1], [0, 1], "k:", lw=1)
        roc_ax.set_xlabel("false positive rate")
        roc_ax.set_ylabel("true positive rate")
        roc_ax.set_title("ROC (federated, binned scores)")
        roc_ax.legend(fontsize=8, loc="lower right")
        cal_ax.plot([0, 1], [0, 1], "k:", lw=1)
        cal_ax.set_xlabel("mean predicted probability")
        # two classes: one curve per model, of the positive class (named)
        cal_ax.set_ylabel(f"fraction of positives ({positive})" if positive
                          else "fraction of positives")
        cal_ax.set_title("calibration (federated)")
        cal_ax.legend(fontsize=8, loc="upper left")
    noise = f", DP ε={res.dp['epsilon']:g}" if res.dp else ""
    fig.suptitle(f"{res.job_id}: {res.contributors} sites{noise}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
