"""``fedforest compare`` (fedforest_cli.compare_cli): --out is checked before the first fit,
and the CSV and the PNG replace the earlier pair only once both are whole."""

from __future__ import annotations

import csv
import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforest_cli.cli import app

WINE = ["compare", "--dataset", "wine", "--epsilons", "inf", "--seeds", "1"]


def _one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("earlier") / "out"
    res = CliRunner().invoke(app, [*WINE, "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return out


def _copy(earlier: Path, to: Path) -> dict[str, bytes]:
    to.mkdir()
    files = {p.name: p.read_bytes() for p in earlier.iterdir()}
    for name, data in files.items():
        (to / name).write_bytes(data)
    assert sorted(files) == ["compare_wine.csv", "compare_wine.png"]
    assert files["compare_wine.csv"].count(b"\n") == 5  # header + 4 methods
    return files


def test_an_interrupt_while_the_csv_is_written_leaves_the_earlier_pair(
        earlier_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    before = _copy(earlier_run, out)
    real = csv.DictWriter.writerow
    calls = []

    def interrupted(self: csv.DictWriter[Any], row: Any) -> Any:
        calls.append(row)
        if len(calls) == 3:  # Ctrl-C arrives among the rows
            raise KeyboardInterrupt
        return real(self, row)

    monkeypatch.setattr(csv.DictWriter, "writerow", interrupted)
    res = CliRunner().invoke(app, [*WINE, "--out", str(out), "--quiet"])
    assert res.exit_code == 130 and len(calls) == 3  # as Ctrl-C ends a command
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_failed_plot_leaves_the_earlier_pair_and_no_part_file(
        earlier_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plot fails half written (a full disk): neither file changes, none is added."""
    from matplotlib.figure import Figure

    out = tmp_path / "out"
    before = _copy(earlier_run, out)

    def half_written(self: Figure, fname: Any, **kw: Any) -> None:
        if isinstance(fname, (str, os.PathLike)):
            Path(fname).write_bytes(b"\x89PNG\r\n\x1a\n")
        else:
            fname.write(b"\x89PNG\r\n\x1a\n")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", half_written)
    res = CliRunner().invoke(app, [*WINE, "--out", str(out), "--quiet"])
    assert res.exit_code == 2 and "No space left on device" in res.output, res.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_out_that_is_a_file_is_refused_before_the_first_fit(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("notes")
    res = CliRunner().invoke(app, [*WINE, "--out", str(afile)])
    assert res.exit_code == 2
    assert _one_line(res.output) == (f"error: --out {afile} is not a directory: name a "
                                     "directory for compare's .png and .csv (nothing was run)")
    res = CliRunner().invoke(app, [*WINE, "--out", str(afile / "sub")])
    assert res.exit_code == 2
    assert _one_line(res.output) == (f"error: --out {afile / 'sub'} cannot be made: {afile} is "
                                     "a file: name a directory for compare's .png and .csv "
                                     "(nothing was run)")
    assert afile.read_text() == "notes"


def test_an_output_file_that_is_a_directory_is_refused_before_the_first_fit(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "compare_wine.csv").mkdir(parents=True)
    res = CliRunner().invoke(app, [*WINE, "--out", str(out)])  # progress lines shown
    assert res.exit_code == 2
    assert _one_line(res.output) == (f"error: {out / 'compare_wine.csv'} is a directory: "
                                     "compare writes its file there; remove it or choose "
                                     "another --out (nothing was run)")
    assert sorted(p.name for p in out.iterdir()) == ["compare_wine.csv"]  # no PNG either
    (out / "compare_wine.csv").rmdir()
    (out / "compare_wine_accuracy.png").mkdir()
    res = CliRunner().invoke(app, [*WINE, "--out", str(out), "--metric", "accuracy"])
    assert res.exit_code == 2 and "compare_wine_accuracy.png is a directory" in res.output


def test_an_out_that_cannot_be_written_is_refused_before_the_first_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes in any directory: the permission check is faked
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != locked
                            and real(path, mode, **kw))
    res = CliRunner().invoke(app, [*WINE, "--out", str(locked / "new")])
    assert res.exit_code == 2
    assert _one_line(res.output) == (f"error: --out {locked / 'new'}: cannot write in "
                                     f"{locked} (nothing was run)")


def test_a_site_whose_rows_are_all_held_out_is_trained_on_with_a_note(tmp_path: Path) -> None:
    """One row of the site 'solo' falls in seed 1's held-out 30%: the run goes on (the row
    is trained on in that seed) and says so, naming the site as the table does."""
    rng = np.random.default_rng(4)
    n = 90
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] > 0).astype(int)
    sites = [f"hosp{k % 3}" for k in range(n)]
    sites[2] = "solo"
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "site", "label"])
        w.writerows([*X[i], sites[i], y[i]] for i in range(n))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["compare", "--csv", str(path), "--target", "label",
                                   "--client-column", "site", "--epsilons", "inf", "--seeds",
                                   "3", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert ("note: site 'solo' had no training row in the 70/30 split of seed 1: its held-out "
            "rows were moved to the training rows there, so that seed scores no row of it"
            ) in _one_line(res.output)
    rows = list(csv.DictReader((out / "compare_t.csv").read_text().splitlines()))
    assert {r["method"] for r in rows} == {"fedforest-open", "fedforest-secure",
                                           "centralized-rf", "local"}
    assert all(r["n_seeds"] == "3" for r in rows)
