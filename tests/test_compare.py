"""Tests for fedforest_secure.experiments.compare and ``fedforest compare`` on tiny settings."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.experiments.compare import (
    METHOD_LABELS,
    ComparisonResult,
    load_csv_table,
    parse_epsilons,
    read_csv,
    run_comparison,
    to_csv,
)

TINY = dict(n_estimators=3, max_depth=3, n_bins=8)
BASE = dict(n_estimators=5, max_depth=4)


def test_parse_epsilons() -> None:
    assert parse_epsilons("8, 0.5,1,inf,1") == [0.5, 1.0, 8.0, math.inf]
    assert parse_epsilons([2, "inf"]) == [2.0, math.inf]
    for bad in ("0", "-1,2", "", "nan"):
        with pytest.raises(ValueError):
            parse_epsilons(bad)
    with pytest.raises(ValueError, match="epsilon must be a number > 0 or inf, got 'abc'"):
        parse_epsilons("1,abc")


def test_run_comparison_classification_outputs(tmp_path: Path) -> None:
    res = run_comparison("breast_cancer", epsilons="1,inf", seeds=1, n_clients=4,
                         fed_params=TINY, baseline_params=BASE)
    assert isinstance(res, ComparisonResult)
    assert res.metric == "balanced_accuracy" and res.columns == [1.0, math.inf]
    assert res.methods == ["fedforest-open", "fedforest-secure", "fedforest-secure-dp",
                           "diffprivlib-rf", "dp-ebm", "centralized-rf", "local"]
    assert res.settings["notes"] == []
    # DP methods at the finite epsilon only; the others in the no-DP column only
    for m in ("fedforest-secure-dp", "diffprivlib-rf", "dp-ebm"):
        assert set(res.scores[m]) == {1.0}
    for m in ("fedforest-open", "fedforest-secure", "centralized-rf", "local"):
        assert set(res.scores[m]) == {math.inf}
    for per_eps in res.scores.values():
        for vals in per_eps.values():
            assert len(vals) == 1 and 0.0 <= vals[0] <= 1.0
    # the non-private federated forests learn something on breast cancer
    assert res.stats("fedforest-open", math.inf)[0] > 0.8  # type: ignore[index]
    out = to_csv(res, tmp_path / "c.csv")
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 7
    assert {r["epsilon"] for r in rows} == {"1", "inf"}
    assert all(r["n_seeds"] == "1" for r in rows)
    assert {r["label"] for r in rows} == {METHOD_LABELS[m] for m in res.methods}
    back = read_csv(out, n_clients=4, alpha=1.0)
    assert back.methods == res.methods and back.columns == res.columns
    for m in res.methods:  # the CSV holds every cell's per-seed scores
        for eps in res.columns:
            assert back.scores.get(m, {}).get(eps) == pytest.approx(
                res.scores.get(m, {}).get(eps), abs=1e-6)


def test_run_comparison_regression_on_a_table_with_clients(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 180
    X = rng.normal(size=(n, 3))
    h = np.arange(n) % 3
    y = X[:, 0] + 0.5 * X[:, 1] + 0.1 * rng.normal(size=n) + 0.2 * h
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "c", "site", "target"])
        for i in range(n):
            w.writerow([*X[i], f"site-{h[i]}", y[i]])
    Xl, yl, hl, task = load_csv_table(path, "target", "site")
    assert task == "regression" and Xl.shape == (n, 3)
    assert set(hl.tolist()) == {"site-0", "site-1", "site-2"}  # the sites as the table names them
    res = run_comparison(data=(Xl, yl, hl, task), name="t", epsilons=[2, math.inf], seeds=[0, 1],
                         fed_params=TINY, baseline_params=BASE)
    assert res.metric == "r2" and res.n_clients == 3
    assert "diffprivlib-rf" not in res.scores  # diffprivlib has no DP forest regressor
    assert set(res.scores["diffprivlib-linreg"]) == {2.0}
    assert len(res.scores["fedforest-secure-dp"][2.0]) == 2
    assert res.stats("centralized-rf", math.inf)[0] > 0.5  # type: ignore[index]
    with pytest.raises(ValueError, match="no DP random-forest regressor"):
        run_comparison(data=(Xl, yl, hl, task), methods=["diffprivlib-rf"], seeds=1)



@pytest.mark.parametrize("cells,message", [
    ({"site": ""}, "column 'site' (the client column) has no value at line 5 ('')"),
    ({"target": ""}, "column 'target' (the target) has no value at line 5 ('')"),
    ({"target": "?"}, "column 'target' (the target) has no value at line 5 ('?')"),
    ({"target": "NA"}, "column 'target' (the target) has no value at line 5 ('NA')"),
    ({"a": ""}, "column 'a' is not a finite number at line 5: ''"),
    ({"b": "n/a"}, "column 'b' is not a finite number at line 5: 'n/a'"),
    ({"b": "nan"}, "column 'b' is not a finite number at line 5: 'nan'"),
    ({"b": "inf"}, "column 'b' is not a finite number at line 5: 'inf'"),
    ({"b": "1e300"}, "column 'b' is not a finite number at line 5: '1e300'"),
])
def test_a_csv_cell_without_a_value_is_named_by_row_and_column(
        tmp_path: Path, cells: dict[str, str], message: str) -> None:
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "site", "target"])
        for i in range(8):  # the header is line 1: the fourth row is line 5
            row = {"a": str(i), "b": str(i % 3), "site": f"s{i % 2}", "target": str(i % 2)}
            if i == 3:
                row.update(cells)
            w.writerow(row.values())
    with pytest.raises(ValueError, match=re.escape(message)):
        load_csv_table(path, "target", "site")


@pytest.mark.parametrize("text,message", [
    ("a,a,target\n1,2,0\n3,4,1\n", "duplicate column names ['a']: rename them"),
    ("a,b,target\n1,2,0\n3,4,1,9\n5,6,1\n", "line 3 does not have 3 cells, as the header"),
    ("a,b,target\n1,2,0\n\n3,4\n", "line 4 does not have 3 cells, as the header"),
    ("a,b,target\n", "no data rows below the header"),
    ("a,b,target\n1,2,1\n3,4,1\n", "the target 'target' has one class ('1')"),
])
def test_a_csv_that_does_not_hold_a_table_is_refused_naming_what_and_where(
        tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_csv_table(path, "target")


def test_a_csv_with_a_byte_order_mark_and_blank_lines_reads_as_without(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("target,a,b\nx,1,2\ny,3,4\nx,5,6\n")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + b"target,a,b\r\nx,1,2\r\n\r\ny,3,4\r\nx,5,6\r\n")
    a, b = load_csv_table(plain, "target"), load_csv_table(bom, "target")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[3] == b[3] == "classification"


def test_compare_refuses_fewer_than_one_client() -> None:
    with pytest.raises(ValueError, match="n_clients must be an integer >= 1, got 0"):
        run_comparison("wine", n_clients=0, seeds=1, epsilons="inf")
    r = CliRunner().invoke(app, ["compare", "--dataset", "wine", "--clients", "0",
                                 "--seeds", "1", "--epsilons", "inf", "--quiet"])
    assert r.exit_code == 2 and "--clients" in r.output


def test_cli_compare_on_a_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 150
    X = rng.normal(size=(n, 3))
    h = rng.integers(0, 3, n)
    y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)
    path = tmp_path / "cls.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["x0", "x1", "x2", "hospital", "label"])
        for i in range(n):
            w.writerow([*X[i], h[i], ["no", "yes"][y[i]]])
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["compare", "--csv", str(path), "--target", "label",
                                 "--client-column", "hospital", "--epsilons", "4,inf",
                                 "--seeds", "1", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    assert (out / "compare_cls.png").exists() and (out / "compare_cls.csv").exists()
    assert "FedForest secure-dp" in r.output
    bad = CliRunner().invoke(app, ["compare", "--epsilons", "-1"])
    assert bad.exit_code == 2


def test_dp_ebm_is_left_out_with_a_note_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    import builtins

    from fedforest_secure.experiments import compare as compare_mod

    # wine has three classes: DP-EBM is binary-only
    assert "binary" in str(compare_mod.dp_ebm_unavailable("classification", 3))
    assert compare_mod.dp_ebm_unavailable("regression", 0) is None
    real_import = builtins.__import__

    def no_interpret(name: str, *args: object, **kw: object) -> object:
        if name.startswith("interpret"):
            raise ImportError(name)
        return real_import(name, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_interpret)
    why = compare_mod.dp_ebm_unavailable("classification", 2)
    assert why is not None and "interpret-core is not installed" in why
    assert "pip install 'fedforest-secure[dp]'" in why  # the installed package's extra
    from rich.console import Console

    shown = Console(record=True, width=200)
    shown.print(f"note: {why}", markup=False)  # as `fedforest compare` prints its notes
    assert "fedforest-secure[dp]" in shown.export_text()
    methods, notes = compare_mod._default_methods("classification", 2)
    assert "dp-ebm" not in methods and notes == [why]
    with pytest.raises(ValueError, match="interpret-core"):
        run_comparison("breast_cancer", epsilons="1", seeds=1, methods=["dp-ebm"])


def test_accuracy_metric_scores_the_same_predictions_as_balanced_accuracy(tmp_path: Path) -> None:
    """On a table with about 15 % positives the two metrics of one run differ, and each
    equals scikit-learn's score of the same seeded fit's predictions."""
    from sklearn.metrics import accuracy_score, balanced_accuracy_score

    from fedforest_secure.experiments import compare
    from fedforest_secure.experiments.baselines import CentralizedRF

    rng = np.random.default_rng(3)
    n = 200
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] + 0.8 * rng.normal(size=n) > 1.0).astype(int)
    assert 0.1 < y.mean() < 0.25
    data = (X, y, None, "classification")
    kw: dict = dict(data=data, methods=["centralized-rf"], seeds=[0, 1], epsilons="inf",
                    baseline_params=BASE)
    acc = run_comparison(**kw, metric="accuracy")
    bal = run_comparison(**kw)
    assert acc.metric == "accuracy" and bal.metric == "balanced_accuracy"
    want_acc, want_bal = [], []
    for seed in (0, 1):
        s = compare._split(X, y, None, "classification", seed, 4, 1.0)
        pred = compare._fit_predict(CentralizedRF(task="classification", **BASE,
                                                  random_state=seed), s)
        want_acc.append(accuracy_score(s.yte, pred))
        want_bal.append(balanced_accuracy_score(s.yte, pred))
    got_acc = acc.stats("centralized-rf", math.inf)[0]  # type: ignore[index]
    got_bal = bal.stats("centralized-rf", math.inf)[0]  # type: ignore[index]
    assert got_acc == pytest.approx(np.mean(want_acc))
    assert got_bal == pytest.approx(np.mean(want_bal))
    assert got_acc != pytest.approx(got_bal)
    with pytest.raises(ValueError, match="does not score a classification task"):
        run_comparison(**kw, metric="r2")


def test_cli_compare_with_another_metric_names_its_files_after_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(120, 2))
    y = (X[:, 0] > 0.5).astype(int)
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "label"])
        w.writerows([*X[i], y[i]] for i in range(len(y)))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["compare", "--csv", str(path), "--target", "label",
                                 "--epsilons", "4,inf", "--seeds", "1", "--out", str(out),
                                 "--metric", "accuracy", "--quiet"])
    assert r.exit_code == 0, r.output
    assert (out / "compare_t_accuracy.csv").exists() and not (out / "compare_t.csv").exists()
    assert "accuracy on the held-out" in r.output and "balanced" not in r.output
    rows = read_csv(out / "compare_t_accuracy.csv")
    assert rows.metric == "accuracy"
    bad = CliRunner().invoke(app, ["compare", "--csv", str(path), "--target", "label",
                                   "--metric", "r2", "--seeds", "1", "--out", str(out)])
    assert bad.exit_code != 0 and "does not score a classification task" in bad.output


def test_every_site_keeps_training_rows_in_every_seed() -> None:
    """Row 10, the only row of the site 'solo', falls in the held-out 30% of seeds 1 and 2:
    there it is trained on instead (local learning needs a forest of its site), the run goes
    on and a note names the site and the seeds."""
    from fedforest_secure.experiments import compare

    rng = np.random.default_rng(4)
    n = 90
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] > 0).astype(int)
    sites = np.array([f"hosp{k % 3}" for k in range(n)])
    sites[10] = "solo"
    res = run_comparison(data=(X, y, sites, "classification"), epsilons="inf", seeds=3,
                         methods=["fedforest-open", "local"], fed_params=TINY,
                         baseline_params=BASE)
    assert res.n_clients == 4
    assert res.settings["notes"] == [
        "site 'solo' had no training row in the 70/30 split of seeds 1, 2: its held-out rows "
        "were moved to the training rows there, so those seeds score no row of it"]
    assert all(len(v) == 3 for per_eps in res.scores.values() for v in per_eps.values())
    codes = np.unique(sites, return_inverse=True)[1]
    solo = int(codes[10])
    for seed, held_out in ((0, False), (1, True), (2, True)):
        s = compare._split(X, y, codes, "classification", seed, 4, 1.0)
        assert solo in s.htr and solo not in s.hte
        assert s.moved.tolist() == ([solo] if held_out else [])
        assert len(s.ytr) + len(s.yte) == n and len(s.yte) == 27 - held_out
    # otherwise the split is scikit-learn's: a seed without such a site is left as it is
    from sklearn.model_selection import train_test_split

    tr, te = train_test_split(np.arange(n), test_size=0.3, random_state=0, stratify=y)
    s0 = compare._split(X, y, codes, "classification", 0, 4, 1.0)
    np.testing.assert_array_equal(s0.Xtr, X[tr])
    np.testing.assert_array_equal(s0.hte, codes[te])


def test_sites_too_small_for_any_held_out_row_are_refused_naming_the_seed() -> None:
    X = np.arange(20, dtype=np.float64)[:, None]
    y = np.arange(20) % 2
    sites = np.array([f"s{k}" for k in range(20)])  # one row each
    with pytest.raises(ValueError, match=re.escape(
            "seed 0: every held-out row belongs to a site without training rows: the sites "
            "have too few rows for a 70/30 split; give each site more rows, or merge the "
            "smallest")):
        run_comparison(data=(X, y, sites, "classification"), epsilons="inf", seeds=1,
                       methods=["local"], baseline_params=BASE)


def test_the_diabetes_comparison_of_docs_privacy_md_reproduces_its_seeded_no_dp_rows() -> None:
    """docs/compare_diabetes.csv and privacy.md section 3's diabetes table: the seeded rows
    without DP (FedForest open and secure, the central and local forests) are the current
    code's, seeds 0 and 1 refitted; the page's cells are the CSV's mean +- std."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "compare_diabetes.csv").read_text(encoding="utf-8")
    shipped = {r["method"]: r for r in csv.DictReader(io.StringIO(text)) if r["epsilon"] == "inf"}
    methods = ["fedforest-open", "fedforest-secure", "centralized-rf", "local"]
    res = run_comparison("diabetes", epsilons=[math.inf], seeds=[0, 1], methods=methods)
    page = (root / "docs" / "privacy.md").read_text(encoding="utf-8")
    table = page[page.index("### Diabetes ("):page.index("![diabetes]")]
    for row in res.rows():
        want = shipped[row["method"]]
        refit = [float(v) for v in row["scores"].split(";")]
        np.testing.assert_allclose(refit, [float(v) for v in want["scores"].split(";")[:2]],
                                   rtol=0, atol=5e-7, err_msg=row["method"])
        cell = f"{float(want['mean']):.3f} ± {float(want['std']):.3f}"
        assert f"| {want['label']} | | | | | | {cell} |" in table
