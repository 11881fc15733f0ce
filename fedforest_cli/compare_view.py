"""What ``fedforest compare`` shows: the comparison as a rich table, as Markdown, as a plot.

The numbers come from :func:`fedforest_secure.experiments.compare.run_comparison` (or
:func:`~fedforest_secure.experiments.compare.read_csv`); this module only draws them.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from rich.table import Table

from fedforest_secure.experiments.compare import DP_METHODS, METHOD_LABELS, ComparisonResult
from fedforest_secure.files import write_atomic

__all__ = ["format_table", "plot", "render", "to_markdown"]


def _cell(res: ComparisonResult, m: str, eps: float) -> str:
    st = res.stats(m, eps)
    if st is None:
        return "—"
    return f"{st[0]:.3f} ± {st[1]:.3f}"


#: how a table and a plot name each metric of :data:`~.compare.METRICS`
METRIC_LABELS = {"balanced_accuracy": "balanced accuracy", "accuracy": "accuracy", "r2": "R²"}


def _header(eps: float) -> str:
    return "ε=∞ (no DP)" if math.isinf(eps) else f"ε={eps:g}"


def format_table(res: ComparisonResult) -> Table:
    """A :class:`rich.table.Table`: a row per method, a column per epsilon, mean ± std."""
    metric = METRIC_LABELS.get(res.metric, res.metric)
    table = Table(title=f"{res.dataset}: {metric} on the held-out 30% (mean ± std over "
                        f"{len(res.seeds)} seed(s), K={res.n_clients})")
    table.add_column("method")
    for eps in res.columns:
        table.add_column(_header(eps), justify="right")
    for m in res.methods:
        table.add_row(METHOD_LABELS.get(m, m), *[_cell(res, m, e) for e in res.columns])
    return table


def to_markdown(res: ComparisonResult) -> str:
    """The same table in Markdown (for docs)."""
    head = "| method | " + " | ".join(_header(e) for e in res.columns) + " |"
    sep = "|---|" + "---:|" * len(res.columns)
    lines = [head, sep]
    for m in res.methods:
        lines.append(f"| {METHOD_LABELS.get(m, m)} | "
                     + " | ".join(_cell(res, m, e) for e in res.columns) + " |")
    return "\n".join(lines)


def plot(res: ComparisonResult, path: str | Path) -> Path:
    """Write :func:`render` to ``path`` in the format its suffix names (PNG without one),
    whole or not at all (:func:`~fedforest_secure.files.write_atomic`)."""
    path = Path(path)
    image = render(res, path.suffix.lstrip(".") or "png")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, image)
    return path


def render(res: ComparisonResult, fmt: str = "png") -> bytes:
    """The plot as an image file's bytes (``fmt``: ``png``, ``svg``, ``pdf``, ...): utility
    against epsilon (log x axis), inf at the right edge, error bars = std.

    DP methods are lines over the finite epsilons; methods without DP are a point at the inf
    edge and a dashed horizontal reference line across the plot.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    finite = [e for e in res.columns if math.isfinite(e)]
    lo = min(finite) if finite else 1.0
    hi = max(finite) if finite else 1.0
    x_inf = hi * 4.0
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    plain = [m for m in res.methods if m not in DP_METHODS]
    for i, m in enumerate(res.methods):
        color = f"C{i}"
        label = METHOD_LABELS.get(m, m)
        xs, mu, sd = [], [], []
        # methods without DP share the inf column: spread them a little so bars stay readable
        shift = 1.07 ** (plain.index(m) - (len(plain) - 1) / 2) if m in plain else 1.0
        for e in res.columns:
            st = res.stats(m, e)
            if st is not None:
                xs.append(x_inf * shift if math.isinf(e) else e)
                mu.append(st[0])
                sd.append(st[1])
        if not xs:
            continue
        if m in DP_METHODS:
            ax.errorbar(xs, mu, yerr=sd, marker="o", capsize=3, color=color, label=label)
        else:
            ax.errorbar(xs, mu, yerr=sd, marker="s", capsize=3, color=color, label=label,
                        linestyle="none")
            ax.axhline(mu[-1], color=color, linestyle="--", linewidth=0.9, alpha=0.7)
    ax.set_xscale("log")
    ticks = finite + [x_inf]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{e:g}" for e in finite] + ["∞"])
    ax.minorticks_off()
    ax.set_xlim(lo / 1.6, x_inf * 1.6)
    if finite:
        ax.axvline(math.sqrt(hi * x_inf), color="0.6", linewidth=0.8, linestyle=":")
    ax.set_xlabel("privacy budget ε (whole training job)")
    ax.set_ylabel(METRIC_LABELS.get(res.metric, res.metric))
    ax.set_title(f"{res.dataset}: utility vs ε ({len(res.seeds)} seed(s), K={res.n_clients}, "
                 f"α={res.alpha:g})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, dpi=120, format=fmt)
    finally:
        plt.close(fig)
    return image.getvalue()
