"""What the CLI shows of an evaluation: the table, the plot, simulate's scores, CV values."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_diabetes

from fedforest_cli.crossval_cli import parse_values
from fedforest_cli.evaluate_view import plot, rows, to_markdown, to_table
from fedforest_cli.sim_data import SimData, SiteData
from fedforest_cli.sim_eval import evaluate as sim_scores
from fedforest_cli.simulate import SimulateOptions
from fedforest_secure import FedForestClassifier, FedForestRegressor
from fedforest_secure.evaluation import EvalResult, EvalSpec
from fedforest_secure.evaluation.inprocess import eval_config, evaluate_in_process
from fedforest_secure.privacy import load_profile


def _classification(tiny_parts: Any, profile: str = "secure") -> EvalResult:
    parts, _ = tiny_parts
    X = np.concatenate([p[0] for p in parts[:3]])
    y = np.concatenate([p[1] for p in parts[:3]])
    models = [FedForestClassifier(n_estimators=3, max_depth=d).fit(X, y).model_.to_json()
              for d in (1, 3)]
    config = eval_config("ev", EvalSpec(models=tuple(models), names=("a", "b")),
                         task="classification", n_features=4, n_clients=3, n_classes=2,
                         profile=load_profile(profile).to_dict())
    return evaluate_in_process(config, [(p[0], p[1]) for p in parts[3:5]] + [parts[0]])


def test_the_table_has_a_row_per_metric_and_model_with_the_difference_to_the_reference(
        tiny_parts: Any, tmp_path: Path) -> None:
    res = _classification(tiny_parts)
    table = rows(res, reference="b")
    acc = [r for r in table if r[0] == "accuracy"]
    assert [r[1] for r in acc] == ["a", "b"] and acc[1][4] == "—"
    a, b = res.model("a").metrics["accuracy"], res.model("b").metrics["accuracy"]
    assert acc[0][2] == f"{a:.4f}" and acc[0][4] == f"{a - b:+.4f}" and acc[0][3] == "—"
    assert to_markdown(res).count("\n") == 2 + 2 * 8
    png = plot(res, tmp_path / "e.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    again = EvalResult.from_json(res.to_json())
    assert again.model("b").metrics == res.model("b").metrics


def test_a_dp_evaluation_shows_the_noise_of_every_metric(tiny_parts: Any) -> None:
    res = _classification(tiny_parts, "secure-dp")
    acc = [r for r in rows(res) if r[0] == "accuracy"]
    assert all(r[3].startswith("± ") for r in acc)
    # the row count in the title is a noisy sum too, and says so
    assert re.search(r"on about -?\d+ \(noisy\) held-out rows", str(to_table(res).title))


def test_a_regression_is_plotted_as_predicted_against_actual(tmp_path: Path) -> None:
    X, y = load_diabetes(return_X_y=True)
    model = FedForestRegressor(n_estimators=3, max_depth=3).fit(X[:300], y[:300]).model_
    spec = EvalSpec(models=(model.to_json(),), target_range=(25.0, 346.0), pva_bins=8)
    config = eval_config("r", spec, task="regression", n_features=10, n_clients=3,
                         target_bound=346.0, profile=load_profile("secure").to_dict())
    res = evaluate_in_process(config, [(X[300 + 40 * k:340 + 40 * k], y[300 + 40 * k:
                                                                          340 + 40 * k])
                                       for k in range(3)])
    assert [r[0] for r in rows(res)][:2] == ["R²", "RMSE"]
    assert plot(res, tmp_path / "r.png").stat().st_size > 1000


def test_simulate_scores_fedforest_by_the_federated_evaluation(tiny_parts: Any) -> None:
    parts, _ = tiny_parts
    res = _classification(tiny_parts)
    sites = [SiteData(f"s{k}", Path("x"), Path("s"), "t", *parts[k]) for k in range(3)]
    X_test = np.concatenate([p[0] for p in parts[3:5]] + [parts[0][0]])
    y_test = np.concatenate([p[1] for p in parts[3:5]] + [parts[0][1]])
    sim = SimData("j", "classification", sites, X_test, y_test, Path("job.toml"))
    model = FedForestClassifier(n_estimators=3, max_depth=1).fit(
        np.concatenate([p[0] for p in parts[:3]]), np.concatenate([p[1] for p in parts[:3]]))
    scores = sim_scores(model.model_, sim, SimulateOptions(trees=3, depth=2), res)
    assert scores["federated"] and scores["fedforest"] == res.models[0].metrics["accuracy"]
    assert scores["fedforest"] == pytest.approx(scores["fedforest_pooled"], abs=1e-12)


def test_cross_validation_values_are_parsed_as_written() -> None:
    assert parse_values("2, 4,6") == [2, 4, 6]
    assert parse_values("0.5,1,none,sqrt") == [0.5, 1, None, "sqrt"]
    with pytest.raises(ValueError):
        parse_values(" , ")


def _evaluation_server(tiny_parts: Any, tmp_path: Path, depths: dict[str, int]
                       ) -> tuple[Path, list[Path]]:
    """A server.toml whose database has sites a, b and c, the schema of their rows, and one
    model file per ``depths`` entry (name: depth)."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_data import schema_dict, write_schema

    parts, feat = tiny_parts
    X = np.concatenate([p[0] for p in parts[:3]])
    y = np.concatenate([p[1] for p in parts[:3]])
    write_schema(tmp_path / "schema.toml", schema_dict(X, y, "classification", feat))
    for name, depth in depths.items():
        model = FedForestClassifier(n_estimators=2, max_depth=depth).fit(X, y).model_
        (tmp_path / f"{name}.json").write_text(model.to_json())
    server = tmp_path / "server.toml"
    server.write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    for site in "abc":
        assert CliRunner().invoke(app, ["server", "add-client", site, "--config",
                                        str(server)]).exit_code == 0
    return server, [tmp_path / f"{name}.json" for name in depths]


def test_evaluate_refuses_an_unknown_reference_before_creating_or_waiting_for_the_job(
        tiny_parts: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job
    from server_app.admin import ServerAdmin

    server, models = _evaluation_server(tiny_parts, tmp_path, {"shallow": 1, "deep": 3})
    runner = CliRunner()
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    args = ["evaluate", "--config", str(server), "--reference", "nosuch", "--timeout", "0"]
    res = runner.invoke(app, [*args, "--job", str(job), "--models", *map(str, models)])
    assert res.exit_code == 2
    assert ("error: --reference 'nosuch' is not one of the models: shallow, deep"
            in " ".join(res.output.split()))
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        assert admin.job("ev") is None  # refused before the job was created
    # an existing job (by file or by id): checked against its models before waiting
    create_eval_job(server, job)
    for given in (str(job), "ev"):
        res = runner.invoke(app, [*args, "--job", given])
        assert res.exit_code == 2
        assert ("error: --reference 'nosuch' is not one of the models: shallow, deep"
                in " ".join(res.output.split())), res.output


def test_evaluate_given_a_training_job_says_so(tiny_parts: Any, job_dir: Any,
                                               tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec

    parts, feat = tiny_parts
    spec = load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3))
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        for k in range(3):
            admin.add_client(f"client-{k}")
        admin.create_job(spec)
    server = tmp_path / "server.toml"
    server.write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", "job-a",
                                   "--timeout", "0"])
    assert res.exit_code == 2
    assert "error: job 'job-a' is a training job, not an evaluation job" in res.output


@pytest.mark.parametrize("job, models", [("eval.toml", False), ("sub/eval", False),
                                         ("ev2", True)])
def test_evaluate_given_a_job_file_that_does_not_exist_says_so(
        tiny_parts: Any, tmp_path: Path, job: str, models: bool) -> None:
    """A mistyped job file (or an id with --models that no job has) is named as a file not
    found, as create-job names it, not taken for the id of a job the server lacks."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    server, _ = _evaluation_server(tiny_parts, tmp_path, {"m1": 2})
    args = ["evaluate", "--config", str(server), "--job", job, "--timeout", "0"]
    if models:
        args += ["--models", str(tmp_path / "m1.json")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert f"error: job file not found: {job} (nor is it the id of a job on this server)" \
        in " ".join(res.output.split())


def test_evaluate_of_an_existing_job_by_id_refuses_other_models(tiny_parts: Any,
                                                                 tmp_path: Path) -> None:
    """An existing job's models are fixed: --models or --names next to its id were ignored
    and its old result printed as if it answered them."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 2})
    runner = CliRunner()
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    create_eval_job(server, job)
    res = runner.invoke(app, ["evaluate", "--config", str(server), "--job", "ev", "--models",
                              str(tmp_path / "m1.json"), "--names", "other", "--timeout", "0"])
    assert res.exit_code == 2
    assert "evaluation job 'ev' exists and scores m1: --models and --names cannot change it" \
        in " ".join(res.output.split())


def test_evaluate_refuses_an_out_that_is_a_file_or_in_a_missing_directory_before_anything(
        tiny_parts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--out an existing file was a FileExistsError traceback, and only after the wait for
    the sites (an hour by default)."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import write_eval_job
    from server_app.admin import ServerAdmin

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 2})
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    (tmp_path / "afile").write_text("keep")
    runner = CliRunner()
    args = ["evaluate", "--config", str(server), "--job", str(job), "--models", str(models[0]),
            "--timeout", "0", "--out"]
    res = runner.invoke(app, [*args, str(tmp_path / "afile")])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert (f"error: --out {tmp_path / 'afile'} is a file: name the directory for "
            "evaluation-<job>.png, .md and .json" in " ".join(res.output.split())), res.output
    assert (tmp_path / "afile").read_text() == "keep"
    res = runner.invoke(app, [*args, str(tmp_path / "nodir" / "out")])
    assert res.exit_code == 2, res.output
    assert (f"error: --out {tmp_path / 'nodir' / 'out'}: the directory {tmp_path / 'nodir'} "
            "does not exist" in " ".join(res.output.split())), res.output
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        assert admin.job("ev") is None  # refused before the job was created
    # a new directory in an existing one is fine: the command waits for the sites, then
    # creates it for the result's files
    res = runner.invoke(app, [*args, str(tmp_path / "results")])
    assert res.exit_code == 2
    assert "the evaluation job ev is still" in " ".join(res.output.split()), res.output
    assert not (tmp_path / "results").exists()
    monkeypatch.setattr("fedforest_cli.evaluate_cli._wait",
                        lambda *a: _classification(tiny_parts).to_json())
    res = runner.invoke(app, [*args, str(tmp_path / "results")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "evaluation-ev.json", "evaluation-ev.md", "evaluation-ev.png"]


def test_each_class_curve_of_a_multiclass_roc_plot_is_labelled_with_its_own_area(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three classes: each one-against-the-rest curve carries its own AUC (their mean is the
    macro-average metric), not the macro average on every curve."""
    from matplotlib.axes import Axes
    from sklearn.datasets import load_wine

    from fedforest_secure import FedForestClassifier

    X, y = load_wine(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    tr, te = idx[:120], idx[120:]
    model = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        X[tr], y[tr], client=np.arange(120) % 3).model_
    spec = EvalSpec(models=(model.to_json(),))
    config = eval_config("w", spec, task="classification", n_features=13, n_clients=3,
                         n_classes=3, profile=load_profile("secure").to_dict())
    site = np.arange(len(te)) % 3
    res = evaluate_in_process(config, [(X[te][site == k], y[te][site == k]) for k in range(3)])
    labels: list[str] = []
    real_legend = Axes.legend

    def keep(ax, *args, **kw):  # type: ignore[no-untyped-def]
        labels.extend(h.get_label() for h in ax.get_lines())
        return real_legend(ax, *args, **kw)

    monkeypatch.setattr(Axes, "legend", keep)
    plot(res, tmp_path / "w.png")
    aucs = [float(lab.rsplit("AUC ", 1)[1].rstrip(")")) for lab in labels if "AUC" in lab]
    assert len(aucs) == 3 and len(set(aucs)) > 1
    assert np.mean(aucs) == pytest.approx(res.models[0].metrics["roc_auc"], abs=2e-4)


def test_cross_validation_under_dp_says_its_scores_are_noisy() -> None:
    """Under a DP profile the out-of-fold scores come from noisy sums, which are not clipped:
    the command says so beside the privacy cost (an accuracy above 1 is no defect)."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    res = CliRunner().invoke(app, ["cross-validate", "--dataset", "breast_cancer", "--param",
                                   "max_depth", "--values", "2", "--folds", "2", "--trees", "2",
                                   "--profile", "secure-dp"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "DP: each training" in out
    assert "the scores are computed from noisy sums (not clipped): the accuracy may leave" in out


def test_models_given_on_the_command_line_do_not_take_the_files_names(
        tiny_parts: Any, tmp_path: Path) -> None:
    """The job file names its models A and B; --models gives others (here the same two the
    other way round): their labels are --names or their files' names, never the file's
    labels on the wrong models. An existing job's labels cannot be changed with --names."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 1, "m2": 2})
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models,
                         names=["A", "B"])
    runner = CliRunner()
    args = ["evaluate", "--config", str(server), "--timeout", "0", "--job", str(job)]
    res = runner.invoke(app, [*args, "--models", str(models[1]), str(models[0]),
                              "--reference", "A"])
    assert res.exit_code == 2
    assert "--reference 'A' is not one of the models: m2, m1" in " ".join(res.output.split())
    create_eval_job(server, job)
    res = runner.invoke(app, [*args, "--names", "X,Y"])
    assert res.exit_code == 2
    assert "evaluation job 'ev' exists and names its models A, B: --names cannot change them" \
        in " ".join(res.output.split()), res.output


def test_names_without_models_are_refused_when_they_would_not_label_the_job_files_models(
        tiny_parts: Any, tmp_path: Path) -> None:
    """The job file names its models A and B: --names X,Y without --models would label
    nothing (the file's labels stay), so the command refuses it and creates no job; --names
    that repeat the file's labels are no change."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import write_eval_job
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 1, "m2": 2})
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models,
                         names=["A", "B"])
    args = ["evaluate", "--config", str(server), "--timeout", "0", "--job", str(job)]
    res = CliRunner().invoke(app, [*args, "--names", "X,Y"])
    assert res.exit_code == 2
    assert (f"--names labels the files of --models: without --models the models of {job} are "
            "labelled by its [evaluation] names (A, B); give --models with --names, or change "
            "names in the file") in " ".join(res.output.split()), res.output
    with ServerAdmin.from_settings(load_settings(server)) as admin:
        assert admin.job("ev") is None
    res = CliRunner().invoke(app, [*args, "--names", "A,B"])
    assert "evaluation job ev created" in " ".join(res.output.split()), res.output
    with ServerAdmin.from_settings(load_settings(server)) as admin:
        assert admin.evaluation_names("ev") == ["A", "B"]


def _declined_evaluation(tiny_parts: Any, tmp_path: Path, codes: dict[int, str]) -> str:
    """What ``fedforest evaluate --job ev`` says (exit code 2 checked, whitespace joined) when
    site b joined the evaluation job and the sites of ``codes`` (client index: decline code)
    declined it."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job
    from server_app.db import Database
    from server_app.phases import MemberState
    from server_app.store import DECLINED, add_message, members_of

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 1})
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    create_eval_job(server, job)
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.session() as sess:
        for m in members_of(sess, "ev"):
            if m.client_index == 1:
                m.state = MemberState.ACTIVE  # b joined
            else:
                add_message(sess, "ev", -1, DECLINED, m.client_index, codes[m.client_index])
    db.dispose()
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", "ev",
                                   "--timeout", "600"])
    assert res.exit_code == 2, res.output
    return " ".join(res.output.split())


def test_evaluate_stops_waiting_once_every_site_left_declined(tiny_parts: Any,
                                                              tmp_path: Path) -> None:
    """Sites a and c joined nothing and declined (their tables do not fit): the job cannot
    start, and the command says so, naming them, instead of waiting out --timeout saying only
    "waiting"; once their clients join, the command waits for the job again."""
    said = _declined_evaluation(tiny_parts, tmp_path, {0: "schema", 2: "table"})
    assert "the evaluation job ev cannot start: a (schema), c (table) declined it" in said
    assert f"once their clients join, `fedforest evaluate --config {tmp_path / 'server.toml'} " \
        "--job ev` waits for it again" in said


def test_evaluate_says_to_cancel_a_job_a_site_declined_as_evaluated_before(
        tiny_parts: Any, tmp_path: Path) -> None:
    """Site a answered an evaluation on the same rows before: it declines the job each time
    its client asks, so the command says to cancel the job rather than to wait for a join, and
    names the site's option that would let it take part."""
    said = _declined_evaluation(tiny_parts, tmp_path, {0: "evaluated_before", 2: "table"})
    assert "the evaluation job ev cannot start: a (evaluated_before), c (table) declined it. " \
        "A site that already answered an evaluation job on the same held-out rows " \
        "(evaluated_before) declines every other one each time its client asks: cancel it " \
        f"(`fedforest server cancel-job --config {tmp_path / 'server.toml'} --job ev`) and " \
        "score all the models to compare in one job; a site's operator who trusts this " \
        "server may start its client with --evaluate-again (a model that site already " \
        "scored on those rows stays refused)" in said
    assert "waits for it again" not in said


def _labelled_wine(classes: list[str] | None) -> EvalResult:
    """Three classes of wine, scored by a model whose file names them ``classes`` in the
    schema's order (as a training job's model file does), not sorted."""
    import dataclasses

    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))
    tr, te = idx[:120], idx[120:]
    model = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        X[tr], y[tr], client=np.arange(120) % 3).model_
    model = dataclasses.replace(model, classes=classes)
    config = eval_config("w", EvalSpec(models=(model.to_json(),), names=("m",)),
                         task="classification", n_features=13, n_clients=3, n_classes=3,
                         profile=load_profile("secure").to_dict())
    site = np.arange(len(te)) % 3
    return evaluate_in_process(config, [(X[te][site == k], y[te][site == k])
                                        for k in range(3)])


def _legends(res: EvalResult, path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The labels of every line the plot's legends show."""
    from matplotlib.axes import Axes

    labels: list[str] = []
    real_legend = Axes.legend

    def keep(ax, *args, **kw):  # type: ignore[no-untyped-def]
        labels.extend(h.get_label() for h in ax.get_lines() if not h.get_label().startswith("_"))
        return real_legend(ax, *args, **kw)

    monkeypatch.setattr(Axes, "legend", keep)
    plot(res, path)
    return labels


def test_the_result_names_each_class_index_by_the_models_class_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Curves stay keyed by class index (the schema's order); ``classes`` gives each index its
    label, and the plot's legends name the class, so "zebra" is not read as the first of the
    sorted labels (apple)."""
    res = _labelled_wine(["zebra", "apple", "mango"])
    assert res.classes == ["zebra", "apple", "mango"]
    doc = json.loads(res.to_json())
    assert doc["classes"] == ["zebra", "apple", "mango"]
    assert list(doc["models"][0]["curves"]["roc"]) == ["0", "1", "2"]
    assert EvalResult.from_json(res.to_json()).classes == ["zebra", "apple", "mango"]
    labels = _legends(res, tmp_path / "w.png", monkeypatch)
    roc = {lab.split(", class ")[1].split(" (AUC")[0]: lab for lab in labels if "AUC" in lab}
    assert list(roc) == ["zebra", "apple", "mango"]
    apple = res.models[0].curves["roc"]["1"]
    auc = float(np.trapezoid(np.asarray(apple["tpr"], dtype=float),
                             np.asarray(apple["fpr"], dtype=float)))
    assert roc["apple"] == f"m, class apple (AUC {auc:.4f})"
    assert [lab for lab in labels if "AUC" not in lab] == [
        "m, class zebra", "m, class apple", "m, class mango"]


def test_a_result_without_class_labels_names_the_schemas_class_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that names no classes (and a result file written before results named them):
    no ``classes`` in the document, and the legend says the number is the schema's index."""
    res = _labelled_wine(None)
    assert res.classes is None and "classes" not in json.loads(res.to_json())
    old = json.loads(res.to_json())
    assert EvalResult.from_json(json.dumps(old)).classes is None
    labels = _legends(res, tmp_path / "w.png", monkeypatch)
    assert [lab.split(" (AUC")[0] for lab in labels if "AUC" in lab] == [
        "m, schema class 0", "m, schema class 1", "m, schema class 2"]


def test_class_labels_that_read_as_indices_are_labels_too(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema whose classes are "0", "1", "2" (a model file names them so): the result
    carries them, and the legend says ``class 1``, as for any other labels."""
    res = _labelled_wine(["0", "1", "2"])
    assert res.classes == ["0", "1", "2"] and json.loads(res.to_json())["classes"] == res.classes
    labels = _legends(res, tmp_path / "w.png", monkeypatch)
    assert [lab.split(" (AUC")[0] for lab in labels if "AUC" in lab] == [
        "m, class 0", "m, class 1", "m, class 2"]


def test_a_two_class_plot_names_the_positive_class_its_calibration_counts(
        tiny_parts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from matplotlib.axes import Axes

    parts, _ = tiny_parts
    X = np.concatenate([p[0] for p in parts[:3]])
    y = np.concatenate([p[1] for p in parts[:3]])
    model = FedForestClassifier(n_estimators=3, max_depth=2).fit(X, y).model_
    model = dataclasses.replace(model, classes=["sick", "well"])
    config = eval_config("ev", EvalSpec(models=(model.to_json(),)), task="classification",
                         n_features=4, n_clients=3, n_classes=2,
                         profile=load_profile("secure").to_dict())
    res = evaluate_in_process(config, [(p[0], p[1]) for p in parts[3:5]] + [parts[0]])
    assert res.classes == ["sick", "well"] and list(res.models[0].curves["roc"]) == ["1"]
    ylabels: list[str] = []
    real = Axes.set_ylabel

    def keep(ax, label, *args, **kw):  # type: ignore[no-untyped-def]
        ylabels.append(label)
        return real(ax, label, *args, **kw)

    monkeypatch.setattr(Axes, "set_ylabel", keep)
    plot(res, tmp_path / "b.png")
    assert ylabels == ["true positive rate", "fraction of positives (class well)"]


def test_evaluate_that_times_out_says_the_job_stays_and_how_to_wait_or_cancel(
        tiny_parts: Any, tmp_path: Path) -> None:
    """No site has joined yet when --timeout runs out: the error says the job stays, and
    gives the commands (with the server's config) that wait for it again or cancel it."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import create_eval_job, write_eval_job

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 1})
    create_eval_job(server, write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open",
                                           models))
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", "ev",
                                   "--timeout", "0"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "the evaluation job ev is still waiting after 0 s. It stays on the server" in said
    assert f"`fedforest evaluate --config {server} --job ev` waits for it again (give the " \
        "same --out and --reference)" in said
    assert f"`fedforest server cancel-job --config {server} --job ev` cancels it" in said


def test_evaluate_names_a_models_file_that_is_not_text_as_no_model_file(
        tiny_parts: Any, tmp_path: Path) -> None:
    """The ONNX file an estimator writes next to its model file, given to --models: the
    error names it and says what a model file is (it was the codec's error alone)."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import write_eval_job
    from server_app.admin import ServerAdmin

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 2})
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x07\x12\x07skl2onnx\x1a\x051.0\xc6\x00")
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", str(job),
                                   "--models", str(onnx), "--timeout", "0"])
    assert res.exit_code == 2, res.output
    assert (f"error: {onnx}: not a model file (not UTF-8 text: invalid continuation byte at "
            "byte 17); a model file is the JSON text that a job's client, fedforest model "
            "download or an estimator's save writes") in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["evaluate", "--config", str(server), "--job", str(job),
                                   "--models", str(tmp_path / "nosuch.json"), "--timeout", "0"])
    assert res.exit_code == 2, res.output
    assert (f"error: cannot read model file {tmp_path / 'nosuch.json'}: No such file or "
            "directory") in " ".join(res.output.split()), res.output
    with ServerAdmin(f"sqlite:///{tmp_path}/s.db") as admin:
        assert admin.job("ev") is None


def test_a_names_label_holding_a_comma_is_written_in_double_quotes(
        tiny_parts: Any, tmp_path: Path) -> None:
    """--names split on every comma: a label "X, 1" gave three labels for two models."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from fedforest_cli.sim_evaluation import write_eval_job
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    server, models = _evaluation_server(tiny_parts, tmp_path, {"m1": 1, "m2": 2})
    job = write_eval_job(tmp_path / "eval.toml", "ev", list("abc"), "open", models)
    args = ["evaluate", "--config", str(server), "--timeout", "0", "--job", str(job),
            "--models", *map(str, models)]
    res = CliRunner().invoke(app, [*args, "--names", '"X, 1",Y', "--reference", "X, 1"])
    assert "is still waiting after 0 s" in " ".join(res.output.split()), res.output
    with ServerAdmin.from_settings(load_settings(server)) as admin:
        assert admin.evaluation_names("ev") == ["X, 1", "Y"]
    res = CliRunner().invoke(app, [*args, "--names", '"X, 1,Y'])
    assert res.exit_code == 2
    assert ("--names '\"X, 1,Y': unexpected end of data: write a name that holds a comma or a "
            "double quote in double quotes") in " ".join(res.output.split()), res.output
