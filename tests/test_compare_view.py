"""Tests for fedforest_cli.compare_view: the table, Markdown and plot of a comparison."""

from __future__ import annotations

import io
import math
from pathlib import Path

from rich.console import Console

from fedforest_cli.compare_view import format_table, plot, to_markdown
from fedforest_secure.experiments.compare import ComparisonResult, read_csv, to_csv


def _result(task: str = "classification") -> ComparisonResult:
    metric = "balanced_accuracy" if task == "classification" else "r2"
    res = ComparisonResult(dataset="toy", task=task, metric=metric, epsilons=[1.0, math.inf],
                           seeds=[0, 1], n_clients=4, alpha=1.0)
    dp_base = "diffprivlib-rf" if task == "classification" else "diffprivlib-linreg"
    for score in (0.90, 0.94):
        res.add("fedforest-open", math.inf, score, 0.1)
        res.add("centralized-rf", math.inf, score + 0.01, 0.1)
        res.add("fedforest-secure-dp", 1.0, score - 0.1, 0.1)
        res.add(dp_base, 1.0, score - 0.2, 0.1)
    return res


def _render(table: object) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_table_has_a_row_per_method_and_a_column_per_epsilon() -> None:
    text = _render(format_table(_result()))
    assert "toy: balanced accuracy" in text and "K=4" in text
    assert "ε=1" in text and "ε=∞ (no DP)" in text
    assert "FedForest secure-dp" in text and "diffprivlib RF" in text
    assert "0.920 ± 0.020" in text  # FedForest open: mean and std (ddof=0) of 0.90, 0.94
    assert "—" in text  # a method without DP has no cell at epsilon = 1


def test_markdown_matches_the_table_and_survives_the_csv(tmp_path: Path) -> None:
    res = _result()
    md = to_markdown(res)
    lines = md.splitlines()
    assert lines[0] == "| method | ε=1 | ε=∞ (no DP) |"
    assert len(lines) == 2 + len(res.methods)
    assert "| FedForest open | — | 0.920 ± 0.020 |" in lines
    back = read_csv(to_csv(res, tmp_path / "c.csv"), n_clients=4, alpha=1.0)
    assert to_markdown(back) == md  # the CSV holds everything the table shows


def test_plot_writes_a_png(tmp_path: Path) -> None:
    for task in ("classification", "regression"):
        png = plot(_result(task), tmp_path / task / "c.png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
