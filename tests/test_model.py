"""Tests for fedforest_secure.model: prediction, JSON round trips (bit for bit), formats."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedforest_secure import FedForestClassifier, FedForestRegressor, ForestModel
from fedforest_secure.errors import SchemaError
from fedforest_secure.evaluation.spec import EvaluationError, load_forest
from fedforest_secure.model import Tree
from fedforest_secure.privacy import load_profile


def _data(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(150, 4)) * np.array([1.0, 1e-7, 1e5, 1.0])  # awkward scales
    y = X[:, 0] / 3 + np.sin(X[:, 1] * 1e7) + 1e-5 * X[:, 2] + 0.1 * rng.normal(size=150)
    h = np.arange(150) % 3
    return X, y, h


@pytest.mark.parametrize("method", ["quantiles", "exact"])
def test_regressor_save_load_is_bit_for_bit(tmp_path: Path, method: str) -> None:
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=4, max_depth=5, n_bins=16, method=method,
                             random_state=3).fit(X, y, client=h)
    path = tmp_path / "reg.json"
    est.save(path)
    back = FedForestRegressor.load(path)
    rng = np.random.default_rng(1)
    Xt = np.vstack([X, rng.normal(size=(200, 4)) * np.array([1.0, 1e-7, 1e5, 1.0])])
    assert back.predict(Xt).tobytes() == est.predict(Xt).tobytes()
    assert back.model_.digest() == est.model_.digest()
    assert back.get_params()["n_estimators"] == 4 and back.get_params()["method"] == method
    assert back.n_features_in_ == 4 and list(back.clients_) == [0, 1, 2]
    # thresholds survive exactly (repr precision)
    for a, b in zip(est.model_.trees, back.model_.trees, strict=True):
        assert a.threshold.tobytes() == b.threshold.tobytes()
        assert a.value.tobytes() == b.value.tobytes()
    # a second save of the loaded estimator is byte-identical
    path2 = tmp_path / "reg2.json"
    back.save(path2)
    assert path2.read_text() == path.read_text()


def test_a_model_with_abstentions_at_ten_levels_or_more_keeps_its_digest(
        tmp_path: Path) -> None:
    """Minimum-leaf abstention counts are kept per client and level (``meta["abstained"]``):
    with trees of 10 levels or more, the model's digest is the same after a save and load,
    and the loaded model saves the same bytes."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 4))
    y = X[:, 0] + rng.normal(size=2000)
    est = FedForestRegressor(n_estimators=2, random_state=3,
                             profile=load_profile("secure", abstain_below=2)).fit(
        X, y, client=rng.integers(0, 3, 2000))
    assert max(t.depth for t in est.model_.trees) >= 10
    path = tmp_path / "a.json"
    est.save(path)
    back = FedForestRegressor.load(path)
    assert back.model_.digest() == est.model_.digest()
    back.save(tmp_path / "b.json")
    assert (tmp_path / "b.json").read_bytes() == path.read_bytes()
    assert back.model_.meta == est.model_.meta  # levels as text keys, as the file has them
    assert {"2", "10"} <= {lv for per in est.model_.meta["abstained"].values() for lv in per}


def test_classifier_save_load_is_bit_for_bit(tmp_path: Path) -> None:
    X, y, h = _data(2)
    labels = np.array(["low", "mid", "high"])[np.digitize(y, [-0.3, 0.4])]
    est = FedForestClassifier(n_estimators=5, max_depth=4, n_bins=8, criterion="entropy",
                              random_state=1).fit(X, labels, client=h)
    path = tmp_path / "clf.json"
    est.save(path)
    back = FedForestClassifier.load(path)
    assert back.predict_proba(X).tobytes() == est.predict_proba(X).tobytes()
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    np.testing.assert_array_equal(back.classes_, est.classes_)
    assert back.criterion == "entropy"
    with pytest.raises(ValueError):
        FedForestRegressor.load(path)  # a classifier file is not a regressor


def test_a_dp_estimator_saved_with_quantiles_its_forest_did_not_use_refits_the_rules_forest(
        tmp_path: Path) -> None:
    """Files saved when the estimators' method defaulted to "quantiles" hold that method, while
    their DP forest took the allocation rule's: loaded, the method reads as left unset, so a
    refit grows the rule's forest again. A method the forest did use is kept."""
    from sklearn.base import clone

    X, y, h = _data(3)
    dp = load_profile("secure-dp", epsilon=1.0)
    est = FedForestRegressor(profile=dp).fit(X, y, client=h)
    assert est.config_.method == "random"
    path = tmp_path / "dp.json"
    est.save(path)
    doc = json.loads(path.read_text())
    assert doc["estimator"]["params"]["method"] is None
    doc["estimator"]["params"]["method"] = "quantiles"  # as such files hold it
    path.write_text(json.dumps(doc))
    back = FedForestRegressor.load(path)
    assert back.method is None
    assert clone(back).fit(X, y, client=h).config_.method == "random"
    named = FedForestRegressor(profile=dp, method="quantiles").fit(X, y, client=h)
    named.save(tmp_path / "named.json")
    assert FedForestRegressor.load(tmp_path / "named.json").method == "quantiles"


def test_h_split_model_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(180, 2))
    h = np.repeat(np.array(["a", "b", "c"]), 60)
    y = X[:, 0] + 8.0 * (h == "b")
    est = FedForestRegressor(n_estimators=2, max_depth=2, max_features=1.0, split_on_client=True,
                             random_state=0).fit(X, y, client=h)
    assert est.model_.uses_client
    est.save(tmp_path / "h.json")
    back = FedForestRegressor.load(tmp_path / "h.json")
    assert back.predict(X, client=h).tobytes() == est.predict(X, client=h).tobytes()
    assert back.model_.trees[0].sets == est.model_.trees[0].sets
    # the file's ForestModel takes the sites by name too (the names it carries), or by index
    model = ForestModel.load(tmp_path / "h.json")
    codes = np.repeat(np.arange(3), 60)
    assert model.predict(X, client=h).tobytes() == est.predict(X, client=h).tobytes()
    assert model.predict(X, client=codes).tobytes() == est.predict(X, client=h).tobytes()
    as_objects = codes.astype(object)  # indices held as Python ints (a pandas Series)
    assert model.predict(X, client=as_objects).tobytes() == est.predict(X, client=h).tobytes()
    with pytest.raises(SchemaError, match=r"unknown site 'z'; the forest knows \['a', 'b', 'c'\]"):
        model.predict(X[:1], client=["z"])
    with pytest.raises(SchemaError, match="site indices"):
        model.predict(X[:1], client=[0.5])


def test_forest_model_json_round_trip_and_format() -> None:
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=2, max_depth=3, random_state=0).fit(X, y, client=h)
    model = est.model_
    text = model.to_json()
    back = ForestModel.from_json(text)
    assert back.to_json() == text
    assert back.predict(X).tobytes() == model.predict(X).tobytes()
    doc = json.loads(text)
    assert doc["format"] == "fedforest-secure/model/v2"
    # a file of the first format (trees only) still loads and predicts the same
    v1 = {k: doc[k] for k in ("task", "n_features", "n_classes", "n_clients", "meta", "trees")}
    old = ForestModel.from_json(json.dumps({**v1, "format": "fedforest-secure/model/v1"}))
    assert old.predict_values(X).tobytes() == model.predict_values(X).tobytes()
    for bad in [json.dumps({**doc, "format": "fedforest-secure/model/v0"}),
                json.dumps({k: v for k, v in doc.items() if k != "format"}),
                json.dumps([doc]), "null", json.dumps("fedforest-secure/model/v1")]:
        with pytest.raises(ValueError):
            ForestModel.from_json(bad)
    with pytest.raises(ValueError):
        ForestModel.from_json("{not json")


def test_a_bare_model_file_loads_as_an_estimator_of_its_task_only(tmp_path: Path) -> None:
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=1, max_depth=2).fit(X, y, client=h)
    p = tmp_path / "bare_model.json"
    est.model_.save(p)
    assert ForestModel.load(p).to_json() == est.model_.to_json()
    back = FedForestRegressor.load(p)  # a model file without the estimator's section
    assert back.predict(X).tobytes() == est.predict(X).tobytes()
    with pytest.raises(ValueError, match="holds a regression forest: read it with "
                                         "FedForestRegressor.load"):
        FedForestClassifier.load(p)
    with pytest.raises(ValueError, match=r"cannot read .*nope.json: No such file or directory"):
        FedForestRegressor.load(tmp_path / "nope.json")
    (tmp_path / "junk.json").write_text('{"format": "something/else"}')
    with pytest.raises(ValueError, match="not a model file"):
        FedForestRegressor.load(tmp_path / "junk.json")
    cut = json.loads(p.read_text())
    del cut["trees"]
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    with pytest.raises(ValueError, match="cut.json: not a model file: no 'trees' field"):
        FedForestRegressor.load(tmp_path / "cut.json")


def _stump(kind: int, feature: int = 0, threshold: float = 0.0,
           sets: dict[int, list[int]] | None = None) -> Tree:
    return Tree(kind=np.array([kind, 0, 0]), feature=np.array([feature, -1, -1]),
                threshold=np.array([threshold, 0.0, 0.0]), left=np.array([1, -1, -1]),
                right=np.array([2, -1, -1]), value=np.array([[0.0], [1.0], [2.0]]),
                n=np.array([10.0, 4.0, 6.0]), sets=sets or {})


def test_tree_apply_kinds() -> None:
    X = np.array([[-1.0, 0], [0.0, 1], [0.5, 2], [3.0, 5]])
    num = _stump(1, 0, 0.0)
    np.testing.assert_array_equal(num.apply(X, None), [1, 1, 2, 2])  # x <= t goes left
    cat = _stump(2, 1, sets={0: [0, 2]})
    np.testing.assert_array_equal(cat.apply(X, None), [1, 2, 1, 2])  # unseen level 5: right
    cli = _stump(3, -1, sets={0: [1]})
    np.testing.assert_array_equal(cli.apply(X, np.array([0, 1, 2, 1])), [2, 1, 2, 1])
    with pytest.raises(ValueError, match="client"):
        cli.apply(X, None)
    assert num.depth == 1 and num.n_nodes == 3
    m = ForestModel(task="regression", n_features=2, n_classes=0, trees=[num, cat], n_clients=3)
    np.testing.assert_allclose(m.predict(X), [1.0, 1.5, 1.5, 2.0])
    m_cli = ForestModel(task="regression", n_features=2, n_classes=0, trees=[cli], n_clients=3)
    with pytest.raises(SchemaError):
        m_cli.predict(X, client=np.array([0, 1, 3, 1]))  # unknown client index
    with pytest.raises(SchemaError):
        m.predict(X[:, :1])
    with pytest.raises(SchemaError):
        m.predict(X, client=np.array([0, 1]))


def test_classification_model_predicts_argmax() -> None:
    t = Tree(kind=np.array([1, 0, 0]), feature=np.array([0, -1, -1]),
             threshold=np.array([0.0, 0, 0]), left=np.array([1, -1, -1]),
             right=np.array([2, -1, -1]),
             value=np.array([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [0.1, 0.2, 0.7]]),
             n=np.array([10.0, 5, 5]))
    m = ForestModel(task="classification", n_features=1, n_classes=3, trees=[t])
    np.testing.assert_array_equal(m.predict(np.array([[-1.0], [1.0]])), [0, 2])
    back = ForestModel.from_json(m.to_json())
    assert back.predict_values(np.array([[1.0]])).tobytes() == \
        m.predict_values(np.array([[1.0]])).tobytes()




# ---------------------------------------------------------------------- one model format
def _frame(seed: int = 5):  # type: ignore[no-untyped-def]
    import pandas as pd

    rng = np.random.default_rng(seed)
    X = pd.DataFrame({"age": rng.uniform(20, 80, 240), "chol": rng.uniform(100, 400, 240),
                      "noise": rng.normal(size=240)})
    y = np.where(X["age"] + 0.1 * X["chol"] > 80, "sick", "well")
    return X, y


def test_predict_on_a_dataframe_takes_columns_by_name_and_refuses_missing_or_unknown() -> None:
    import pandas as pd

    X, y = _frame()
    est = FedForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(X, y)
    assert list(est.feature_names_in_) == ["age", "chol", "noise"]
    shuffled = X[["noise", "age", "chol"]]
    np.testing.assert_array_equal(est.predict_proba(shuffled), est.predict_proba(X))
    assert (est.predict(shuffled) == y).mean() > 0.8
    with pytest.raises(SchemaError, match=r"missing column 'chol'.*the model's columns are "
                                          r"age, chol, noise"):
        est.predict(X[["age", "noise"]])
    with pytest.raises(SchemaError, match=r"unknown column 'num'"):
        est.predict(X.assign(num=0))
    with pytest.raises(SchemaError, match=r"duplicate column 'age'"):
        est.predict(pd.concat([X, X[["age"]]], axis=1))
    # arrays keep the column order of fit (with scikit-learn's warning that X has no names)
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        np.testing.assert_array_equal(est.predict_proba(X.to_numpy()), est.predict_proba(X))


def test_a_jobs_model_file_loads_with_labels_names_schema_and_predicts_on_site_rows(
        tmp_path: Path) -> None:
    """What the server stores: the forest plus the job's schema; FedForestClassifier.load reads
    it, and predict_proba takes a site's rows as they are in its CSV (levels as labels)."""
    import pandas as pd

    from fedforest_secure.schema import Schema

    schema_text = ('[target]\nname = "num"\nkind = "classification"\nclasses = ["no", "yes"]\n'
                   '[[features]]\nname = "age"\nkind = "continuous"\nbounds = [0.0, 120.0]\n'
                   '[[features]]\nname = "cp"\nkind = "categorical"\nlevels = ["1", "2", "4"]\n')
    schema = Schema.from_dict(__import__("tomllib").loads(schema_text))
    rows = pd.DataFrame({"cp": [1, 4, 2, 4, 1, 2] * 30,
                         "age": np.linspace(30, 70, 180)})
    codes, _, _ = schema.validate_table(rows, with_target=False)
    y = (codes[:, 1] == 2).astype(int)  # cp = 4 is sick
    forest = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        codes, y, client=np.arange(180) % 3).model_
    job_model = forest.for_job(schema_text, ["a", "b", "c"])
    path = tmp_path / "model.json"
    path.write_text(job_model.to_json())  # byte for byte what a site downloads
    est = FedForestClassifier.load(path)
    assert list(est.classes_) == ["no", "yes"] and list(est.feature_names_in_) == ["age", "cp"]
    assert list(est.clients_) == ["a", "b", "c"]
    proba = est.predict_proba(rows)  # columns in another order, cp as its labels
    np.testing.assert_array_equal(proba, forest.predict_values(codes))
    assert proba.shape == (180, 2) and (est.predict(rows) == np.where(y, "yes", "no")).all()
    with pytest.raises(SchemaError, match="unknown level '3'"):
        est.predict(rows.assign(cp=3))
    # the site's CSV as it is: the schema's target column is not a feature and is left out
    site_csv = rows.assign(num=np.where(y, "yes", "no"))
    np.testing.assert_array_equal(est.predict_proba(site_csv), proba)
    # columns the schema does not name are ignored, as Schema.read_csv ignores them
    np.testing.assert_array_equal(est.predict_proba(site_csv.assign(other=0)), proba)
    with pytest.raises(SchemaError, match=r"missing column 'cp'"):
        est.predict(site_csv.drop(columns="cp"))
    assert ForestModel.load(path).schema == schema.to_dict()
    # saved again, the file claims no parameters or profile it does not know (the job's
    # model records neither): it is the job's model file as it was
    est.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()



def test_a_jobs_model_predicts_on_what_its_schema_reads_from_a_site_table(
        tmp_path: Path) -> None:
    """A site's table as Schema.read_csv reads it: the client column, the target and the
    columns the schema does not name are there and are not features; predict takes the
    features by name and leaves the rest, as reading the table for training does. A model
    without a schema still refuses a column it does not know."""
    import pandas as pd

    from fedforest_secure.schema import Schema

    schema_text = ('client_column = "site"\n'
                   '[target]\nname = "num"\nkind = "classification"\nclasses = ["no", "yes"]\n'
                   '[[features]]\nname = "age"\nkind = "continuous"\nbounds = [0.0, 120.0]\n'
                   '[[features]]\nname = "cp"\nkind = "categorical"\nlevels = ["1", "2", "4"]\n')
    schema = Schema.from_dict(__import__("tomllib").loads(schema_text))
    age = np.linspace(30, 70, 180)
    cp = np.array([1, 4, 2, 4, 1, 2] * 30)
    site = pd.DataFrame({"fbs": np.arange(180) % 2, "age": age, "cp": cp,
                         "num": np.where(cp == 4, "yes", "no"),
                         "site": np.array(["a", "b", "c"])[np.arange(180) % 3]})
    csv = tmp_path / "site.csv"
    site.to_csv(csv, index=False)
    codes, y, _ = schema.read_csv(csv)  # the schema reads this table: fbs is ignored
    forest = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        codes, y, client=np.arange(180) % 3).model_
    path = tmp_path / "model.json"
    path.write_text(forest.for_job(schema_text, ["a", "b", "c"]).to_json())
    est = FedForestClassifier.load(path)
    proba = est.predict_proba(site)
    np.testing.assert_array_equal(proba, forest.predict_values(codes))
    np.testing.assert_array_equal(est.predict_proba(pd.read_csv(csv)), proba)
    assert (est.predict(site) == site["num"]).all()
    np.testing.assert_array_equal(ForestModel.load(path).predict_values(site), proba)
    # without a schema, an unknown column is still refused
    bare = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        site[["age", "cp"]], site["num"])
    with pytest.raises(SchemaError, match=r"unknown columns 'fbs', 'site'"):
        bare.predict(site.drop(columns="num"))


def test_a_jobs_model_with_classes_out_of_order_reads_as_sklearn_expects(
        tmp_path: Path) -> None:
    """A schema lists its classes in its own order ("low", "mid", "high"); scikit-learn's
    metrics take predict_proba's columns in sorted order of classes_. The loaded estimator
    gives sorted classes_ with the columns to match (log_loss / roc_auc_score read them so),
    and saves the job's file as it was."""
    from sklearn.metrics import log_loss, roc_auc_score

    schema_text = ('[target]\nname = "level"\nkind = "classification"\n'
                   'classes = ["low", "mid", "high"]\n'
                   '[[features]]\nname = "x"\nkind = "continuous"\nbounds = [0.0, 3.0]\n')
    rng = np.random.default_rng(2)
    X = rng.uniform(0, 3, size=(300, 1))
    codes = np.minimum(X[:, 0].astype(int), 2)  # 0: low, 1: mid, 2: high
    forest = FedForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(
        X, codes, client=np.arange(300) % 3).model_
    path = tmp_path / "model.json"
    path.write_text(forest.for_job(schema_text, ["a", "b", "c"]).to_json())
    est = FedForestClassifier.load(path)
    assert list(est.classes_) == ["high", "low", "mid"]
    labels = np.array(["low", "mid", "high"])[codes]
    proba = est.predict_proba(X)
    np.testing.assert_array_equal(proba, forest.predict_values(X)[:, [2, 0, 1]])
    assert (est.predict(X) == labels).mean() > 0.9
    assert est.score(X, labels) == (est.predict(X) == labels).mean()
    assert log_loss(labels, proba) < 0.3
    assert roc_auc_score(labels, proba, multi_class="ovr", labels=est.classes_) > 0.95
    est.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


def test_a_tie_goes_to_the_first_class_of_the_objects_own_order(tmp_path: Path) -> None:
    """Two trees vote for opposite classes of a job whose schema lists "lo" before "hi": every
    row ties. The loaded estimator (classes_ sorted: "hi", "lo") and its scikit-learn export
    give each tie to "hi"; the job's ForestModel (the schema's order, as a federated
    evaluation reads it) to "lo", as the estimator's predict docstring says."""
    schema_text = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["lo", "hi"]\n'
                   '[[features]]\nname = "x"\nkind = "continuous"\nbounds = [0.0, 1.0]\n')
    x = np.linspace(0, 1, 60)[:, None]
    y = (x[:, 0] > 0.5).astype(int)
    forest = FedForestClassifier(n_estimators=2, max_depth=1, random_state=0).fit(
        x, y, client=np.arange(60) % 3).model_
    doc = json.loads(forest.for_job(schema_text, ["a", "b", "c"]).to_json())
    for tree, vote in zip(doc["trees"], ([1.0, 0.0], [0.0, 1.0]), strict=True):
        tree["value"] = [vote] * len(tree["value"])
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    est = FedForestClassifier.load(path)
    assert list(est.classes_) == ["hi", "lo"]
    np.testing.assert_array_equal(est.predict_proba(x), np.full((60, 2), 0.5))
    assert list(est.predict(x)) == ["hi"] * 60
    import pandas as pd

    assert list(est.to_sklearn().predict(pd.DataFrame(x, columns=["x"]))) == ["hi"] * 60
    model = ForestModel.load(path)
    assert [model.classes[i] for i in model.predict(x)] == ["lo"] * 60  # type: ignore[index]


def test_an_estimator_whose_parameters_are_numpy_scalars_saves_and_loads(
        tmp_path: Path) -> None:
    """A grid search over ``np.arange(...)`` hands its best estimator numpy scalars: the
    file holds them as JSON numbers and booleans, and the estimator reads back the same."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] > 0).astype(int)
    est = FedForestClassifier(n_estimators=np.int64(3), max_depth=np.int32(3),
                              bootstrap=np.bool_(True), max_features=np.float64(0.5),
                              random_state=0).fit(X, y, client=np.arange(120) % 3)
    est.save(tmp_path / "m.json")
    back = FedForestClassifier.load(tmp_path / "m.json")
    params = back.get_params()
    assert {k: (type(params[k]), params[k]) for k in
            ("n_estimators", "max_depth", "bootstrap", "max_features")} == {
        "n_estimators": (int, 3), "max_depth": (int, 3), "bootstrap": (bool, True),
        "max_features": (float, 0.5)}
    np.testing.assert_array_equal(back.predict_proba(X), est.predict_proba(X))


def test_a_file_saved_with_a_sketch_size_above_todays_cap_still_loads_and_predicts(
        tmp_path: Path) -> None:
    """New fits cap n_bins at 4096; a file an estimator saved with more loads as it was."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=90)
    est = FedForestRegressor(n_estimators=2, max_depth=2, n_bins=4096, random_state=0).fit(
        X, y, client=np.arange(90) % 3)
    est.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["estimator"]["params"]["n_bins"] = doc["estimator"]["config"]["n_bins"] = 5000
    (tmp_path / "old.json").write_text(json.dumps(doc))
    back = FedForestRegressor.load(tmp_path / "old.json")
    assert back.n_bins == 5000 and back.config_.n_bins == 5000
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_a_jobs_model_scores_a_site_csv_whose_class_labels_pandas_reads_as_numbers(
        tmp_path: Path) -> None:
    """The schema's classes are text ("0", "1"); pandas reads the CSV's target as integers:
    score matches them as the site's client does (1, 1.0 and "1" are the class "1")."""
    import pandas as pd

    schema_text = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n'
                   '[[features]]\nname = "x"\nkind = "continuous"\nbounds = [0.0, 1.0]\n')
    x = np.linspace(0, 1, 120)
    y = (x > 0.5).astype(int)
    forest = FedForestClassifier(n_estimators=3, max_depth=2, random_state=0).fit(
        x[:, None], y, client=np.arange(120) % 3).model_
    path = tmp_path / "model.json"
    path.write_text(forest.for_job(schema_text, ["a", "b", "c"]).to_json())
    est = FedForestClassifier.load(path)
    site = pd.DataFrame({"x": x, "y": y})
    right = float((est.predict_proba(site).argmax(axis=1) == y).mean())
    assert right > 0.9
    for labels in (site["y"], site["y"].astype(float), site["y"].astype(str)):
        assert est.score(site, labels) == right
    with pytest.raises(SchemaError, match="unknown class '2'"):
        est.score(site, site["y"] + 1)


def test_feature_importances_come_from_the_split_gains() -> None:
    X, y = _frame(6)
    est = FedForestClassifier(n_estimators=6, max_depth=3, max_features=None,
                              random_state=0).fit(X, y)
    imp = est.model_.feature_importances()
    assert imp.shape == (3,) and abs(imp.sum() - 1.0) < 1e-12
    assert imp[2] < imp[0]  # noise matters less than age
    doc = est.model_.to_dict()
    for tree in doc["trees"]:
        del tree["gain"], tree["impurity"]
    with pytest.raises(ValueError, match="does not record split gains"):
        ForestModel.from_dict(doc).feature_importances()


@pytest.mark.parametrize("profile", ["open", "secure-dp"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_model_and_estimator_importances_agree(task: str, profile: str) -> None:
    """ForestModel.feature_importances, the estimator's feature_importances_ (node
    impurities, scikit-learn's rule) and those of its scikit-learn export are one quantity,
    under DP too (whose random splits record no gain, and whose noisy decreases below zero
    count as none)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 5))
    signal = 2.0 * X[:, 0] + X[:, 1] ** 2
    prof = load_profile(profile, epsilon=8.0) if profile != "open" else profile
    kw = dict(n_estimators=8, max_depth=4, random_state=1, profile=prof)
    h = np.arange(400) % 3
    est = (FedForestClassifier(**kw).fit(X, signal > 1, client=h)
           if task == "classification" else FedForestRegressor(**kw).fit(X, signal, client=h))
    imp = est.model_.feature_importances()
    np.testing.assert_allclose(imp, est.feature_importances_, atol=1e-12)
    assert (imp >= 0).all() and imp.sum() == pytest.approx(1.0)  # a DP model's too, not zeros
    # scikit-learn's own computation over the exported trees agrees, under DP too
    np.testing.assert_allclose(imp, est.to_sklearn(hard_splits=True).feature_importances_,
                               atol=1e-9)
    if profile == "open":  # (DP noise, drawn afresh each fit, may blur which features matter)
        assert est.feature_importances_[:2].sum() > 0.5


# ---------------------------------------------------------------------- inconsistent files
@pytest.fixture(scope="module")
def iris_file() -> dict:  # type: ignore[type-arg]
    """A saved 3-class classifier's model file (4 features, 3 sites), as a mapping."""
    rng = np.random.default_rng(21)
    X = rng.normal(size=(150, 4))
    y = np.array(["a", "b", "c"])[(X[:, 0] > -0.4).astype(int) + (X[:, 1] > 0.4)]
    est = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(150) % 3)
    doc: dict = json.loads(est.model_.to_json())  # type: ignore[type-arg]
    assert doc["trees"][0]["kind"][0] == 1 and doc["trees"][1]["kind"][0] == 1
    return doc


def _set(path: tuple, value: object):  # type: ignore[no-untyped-def,type-arg]
    def change(d: dict) -> None:  # type: ignore[type-arg]
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value
    return change


def _drop(path: tuple):  # type: ignore[no-untyped-def,type-arg]
    def change(d: dict) -> None:  # type: ignore[type-arg]
        for key in path[:-1]:
            d = d[key]
        del d[path[-1]]
    return change


def _leaves(tree: int, value: list[float]):  # type: ignore[no-untyped-def]
    """Set every leaf value of one tree of a model file."""
    def change(d: dict) -> None:  # type: ignore[type-arg]
        t = d["trees"][tree]
        for i, kind in enumerate(t["kind"]):
            if kind == 0:
                t["value"][i] = list(value)
    return change


_INCONSISTENT = [
    ("child out of range", _set(("trees", 0, "left", 0), 999),
     r"tree 0, node 0: left child 999 is not a node after it \(the tree has \d+ nodes\)"),
    ("child loops back", _set(("trees", 1, "right", 0), 0),
     r"tree 1, node 0: right child 0 is not a node after it"),
    ("feature out of range", _set(("trees", 1, "feature", 0), 99),
     r"tree 1, node 0: feature 99 is not one of the forest's 4 features"),
    ("too few classes", _set(("classes",), ["a", "b"]),
     r"classes has 2 labels, n_classes is 3"),
    ("wrong n_classes", _set(("n_classes",), 5),
     r"tree 0: value has 3 columns, the forest's n_classes is 5"),
    ("unknown task", _set(("task",), "clustering"),
     r"task must be 'regression' or 'classification', got 'clustering'"),
    ("short array", _set(("trees", 0, "feature"), [0]),
     r"tree 0: feature has 1 entries, kind has \d+"),
    ("nan threshold", _set(("trees", 0, "threshold", 0), "nan"),
     r"tree 0, node 0: threshold nan is not a number"),
    ("nan value", _set(("trees", 1, "value", 0), [float("nan"), 0.5, 0.5]),
     r"tree 1: value is not finite at node 0"),
    ("names of other length", _set(("feature_names",), ["x0", "x1"]),
     r"feature_names has 2 names, n_features is 4"),
    ("sites of other length", _set(("clients",), [0, 1]),
     r"clients has 2 sites, n_clients is 3"),
    ("no trees", _set(("trees",), []),
     r"trees is empty: a forest has at least one tree"),
    ("negative leaf value", _leaves(1, [-5.0, 3.0, 3.0]),
     r"tree 1, node \d+: leaf value \[-5.0, 3.0, 3.0\] is not class proportions \(each in "
     r"\[0, 1\], adding up to 1, or all 0\)"),
    ("leaf proportions not adding up to 1", _leaves(0, [0.2, 0.2, 0.2]),
     r"tree 0, node \d+: leaf value \[0.2, 0.2, 0.2\] is not class proportions"),
    ("tree without left", _drop(("trees", 1, "left")), r"tree 1: no 'left' field"),
    ("no task", _drop(("task",)), r"not a model file: no 'task' field"),
    ("null threshold", _set(("trees", 0, "threshold", 0), None),
     r"tree 0, node 0: threshold null is not a number"),
    ("text threshold", _set(("trees", 0, "threshold", 0), "abc"),
     r"tree 0, node 0: threshold \"abc\" is not a number"),
    ("trees not a list", _set(("trees",), "many"), r"trees must be a list of trees"),
    ("tree not a mapping", _set(("trees", 1), [1, 2]), r"tree 1: not a mapping of node arrays"),
    ("meta not a mapping", _set(("meta",), [1]), r"meta must be a mapping, got \[1\]"),
    ("feature names as numbers", _set(("feature_names",), [1, 2, 3, 4]),
     r"feature_names must be text \(the column names\), got 1"),
    ("sets a number", _set(("trees", 0, "sets"), 0),
     r"tree 0: sets must be a mapping of node ids to lists, got 0"),
    ("sets null", _set(("trees", 1, "sets"), None),
     r"tree 1: sets must be a mapping of node ids to lists, got null"),
    ("set not a list", _set(("trees", 0, "sets"), {"0": 3}),
     r"tree 0: sets, node 0: 3 is not a list of indices"),
    ("set of no node", _set(("trees", 0, "sets"), {"x": [1]}),
     r"tree 0: sets: 'x' is not a node id"),
    ("child beyond int64", _set(("trees", 0, "left", 0), 1e308),
     r"tree 0, node 0: left 1e\+308 is not an integer of int64's range"),
    ("feature beyond int64", _set(("trees", 1, "feature", 0), 10**30),
     r"tree 1, node 0: feature 1000000000000000000000000000000 is not an integer of int64's "
     r"range"),
    ("fractional child", _set(("trees", 0, "right", 0), 1.5),
     r"tree 0, node 0: right 1.5 is not an integer of int64's range"),
    ("kind beyond int64", _set(("trees", 0, "kind", 0), -(10**19)),
     r"tree 0, node 0: kind -10000000000000000000 is not an integer of int64's range"),
    ("children not a list", _set(("trees", 0, "left"), 4),
     r"tree 0: left must be a list of integers, got 4"),
]


@pytest.mark.parametrize(("change", "message"), [c[1:] for c in _INCONSISTENT],
                         ids=[c[0] for c in _INCONSISTENT])
def test_an_inconsistent_model_file_is_refused_at_load_naming_field_and_tree(
        tmp_path: Path, iris_file: dict, change: object, message: str) -> None:  # type: ignore[type-arg]
    doc = json.loads(json.dumps(iris_file))
    change(doc)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        ForestModel.from_dict(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="tampered.json: " + message):
        FedForestClassifier.load(path)
    with pytest.raises(EvaluationError, match=r"not a FedForest model file \(" + message):
        load_forest(path.read_text())
    ForestModel.from_dict(iris_file)  # the file as written loads


@pytest.mark.parametrize(("offset", "shown"), [
    ([1], "[1]"), ("abc", '"abc"'), (float("nan"), "NaN"), (float("inf"), "Infinity"),
    (10**400, "1" + "0" * 39)])
def test_an_evaluation_refuses_an_old_estimator_file_whose_offset_is_no_finite_number(
        iris_file: dict, offset: object, shown: str) -> None:  # type: ignore[type-arg]
    text = json.dumps({"format": "fedforest-secure/estimator/v1", "model": iris_file,
                       "y_offset": offset})
    with pytest.raises(EvaluationError, match=r"not a FedForest model file \(y_offset must be "
                                              rf"a finite number, got {re.escape(shown)}\)"):
        load_forest(text)


def test_leaf_values_of_a_counts_vote_may_be_negative_noisy_counts(
        iris_file: dict) -> None:  # type: ignore[type-arg]
    """A DP classifier whose forest votes with summed noisy counts (``vote = "counts"``) has
    leaf values below 0 and above 1: such a file loads and predicts probabilities."""
    doc = json.loads(json.dumps(iris_file))
    _leaves(1, [-5.0, 3.0, 3.0])(doc)
    doc["vote"] = "counts"
    proba = ForestModel.from_dict(doc).predict_values(np.zeros((3, 4)))
    assert (proba >= 0).all() and np.allclose(proba.sum(axis=1), 1.0)


@pytest.mark.parametrize("offset", [float("nan"), float("inf"), "12", 10**400])
def test_a_regression_file_with_an_offset_that_is_no_finite_number_is_refused(
        tmp_path: Path, offset: object) -> None:
    X, y, h = _data()
    doc = json.loads(FedForestRegressor(n_estimators=2, max_depth=2).fit(
        X, y, client=h).model_.to_json())
    doc["y_offset"] = offset
    path = tmp_path / "offset.json"
    path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    with pytest.raises(ValueError, match=r"offset.json: y_offset must be a finite number, "
                                         rf"got {offset!r}"):
        FedForestRegressor.load(path)


_DROP = object()  # a field left out
_BAD_SECTIONS = [
    ("unknown parameter", ("params", "colour"), 1,
     r"estimator.params: unknown parameter 'colour' of FedForestClassifier"),
    ("edited configuration", ("config",), {"x": 1},
     r"estimator.config is not a job configuration: .*'x'"),
    ("params not a mapping", ("params",), [1],
     r"estimator.params must be a mapping of parameters"),
    ("no params", ("params",), _DROP,
     r"estimator has no 'params' field \(the estimator's parameters\)"),
]


@pytest.mark.parametrize(("where", "value", "message"), [c[1:] for c in _BAD_SECTIONS],
                         ids=[c[0] for c in _BAD_SECTIONS])
def test_an_edited_estimator_section_is_refused_naming_the_file(
        tmp_path: Path, where: tuple, value: object, message: str) -> None:  # type: ignore[type-arg]
    X, y, h = _data()
    path = tmp_path / "saved.json"
    FedForestClassifier(n_estimators=2, max_depth=2).fit(X, y > 0, client=h).save(path)
    doc = json.loads(path.read_text())
    if value is _DROP:
        _drop(("estimator", *where))(doc)
    else:
        _set(("estimator", *where), value)(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="saved.json: " + message):
        FedForestClassifier.load(path)


def test_a_forest_of_an_unknown_task_is_not_sent_to_the_other_estimator(
        tmp_path: Path, iris_file: dict) -> None:  # type: ignore[type-arg]
    path = tmp_path / "clusters.json"
    path.write_text(json.dumps({**iris_file, "task": "clustering"}))
    for cls in (FedForestClassifier, FedForestRegressor):
        with pytest.raises(ValueError, match="task must be") as info:
            cls.load(path)
        assert "read it with" not in str(info.value)


def test_a_split_set_outside_its_levels_or_sites_is_refused() -> None:
    cli = _stump(3, -1, sets={0: [1, 3]})
    with pytest.raises(ValueError, match=r"tree 0, node 0: site 3 is not one of the forest's "
                                         r"3 sites"):
        ForestModel(task="regression", n_features=2, n_classes=0, trees=[cli], n_clients=3)
    cat = _stump(2, 1, sets={0: [0, -2]})
    with pytest.raises(ValueError, match=r"tree 0, node 0: level -2 is not a level index"):
        ForestModel(task="regression", n_features=2, n_classes=0, trees=[cat])
    huge = _stump(2, 1, sets={0: [0, 10**13]})  # predict would allocate terabytes
    with pytest.raises(ValueError, match=r"tree 0, node 0: level 10000000000000 is beyond the "
                                         r"1048576 levels"):
        ForestModel(task="regression", n_features=2, n_classes=0, trees=[huge])


def test_a_model_file_with_repeated_feature_names_still_loads_and_predicts_arrays(
        tmp_path: Path, iris_file: dict) -> None:  # type: ignore[type-arg]
    """Earlier versions' fit kept repeated DataFrame column names: such a file loads and
    predicts on arrays; a DataFrame, matched by name, is refused naming the column."""
    import pandas as pd

    path = tmp_path / "dup.json"
    path.write_text(json.dumps({**iris_file, "feature_names": ["x0", "x1", "x1", "x3"]}))
    est = FedForestClassifier.load(path)
    X = np.random.default_rng(0).normal(size=(5, 4))
    with pytest.warns(UserWarning, match="valid feature names"):  # as scikit-learn warns
        assert est.predict(X).shape == (5,)
    with pytest.raises(SchemaError, match="'x1'"):
        est.predict(pd.DataFrame(X, columns=["x0", "x1", "x1", "x3"]))


def test_feature_names_given_as_a_tuple_are_taken_as_a_list() -> None:
    """A model built through the Python API with feature names as a tuple predicts on a
    table by name, as with a list (a model file holds a list)."""
    import pandas as pd

    m = ForestModel(task="regression", n_features=2, n_classes=0,
                    trees=[_stump(1, 1, 0.0)], feature_names=("a", "b"))
    assert m.feature_names == ["a", "b"]
    X = pd.DataFrame({"b": [-1.0, 1.0], "a": [9.0, 9.0]})
    np.testing.assert_allclose(m.predict(X), [1.0, 2.0])


@pytest.mark.parametrize("text", ["?", "none", "n/a", "null", "", "na", "NA"])
def test_a_model_without_a_schema_refuses_text_in_a_number_column_as_fit_does(
        text: str, tmp_path: Path) -> None:
    """Without a schema nothing declares missing-value words: fit on a table with a text cell
    refuses it, and so does predict (it read "?", "none", "" ... as missing); None and NaN
    cells stay missing values. A job's model reads them by its schema's rules."""
    from job_models import job_model_file, site_rows

    X, y = _frame()
    est = FedForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(X, y)
    odd = X.astype({"chol": object})
    odd.loc[4, "chol"] = text
    said = re.escape(f"column 'chol', row 5: '{text}' is not a number")
    with pytest.raises(SchemaError, match=said):
        FedForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(odd, y)
    with pytest.raises(SchemaError, match=said):
        est.predict(odd)
    holes = X.astype({"chol": object})
    holes.loc[4, "chol"], holes.loc[6, "chol"] = None, np.nan
    nan = X.copy()
    nan.loc[[4, 6], "chol"] = np.nan
    np.testing.assert_array_equal(est.predict_proba(holes), est.predict_proba(nan))
    # a job's model: its schema allows age to miss, so the word is a missing value there
    job = FedForestClassifier.load(job_model_file(tmp_path, "classification", profile="open",
                                                  n_estimators=2, max_depth=3))
    rows = site_rows("classification")[0].head(8)
    worded = rows.astype({"age": object})
    worded.loc[4, "age"] = text
    np.testing.assert_array_equal(job.predict_proba(worded),
                                  job.predict_proba(rows.assign(age=rows["age"].where(
                                      rows.index != 4))))
