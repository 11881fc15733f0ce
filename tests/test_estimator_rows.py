"""How the estimators read the rows to predict (``_estimator_rows``): a table's column labels
and its values, as scikit-learn's forests read them."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.ensemble import RandomForestRegressor

from fedforest_secure import FedForestRegressor
from fedforest_secure.errors import SchemaError

pd = pytest.importorskip("pandas")


def _table() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    A = rng.normal(size=(60, 3))
    return A, A[:, 0] + 0.1 * rng.normal(size=60)


def test_a_frame_whose_labels_are_not_strings_predicts_by_position_with_sklearns_warning(
        ) -> None:
    """Fit on columns "0", "1", "2", predict on pd.DataFrame(array) (labels 0, 1, 2): the
    labels are no feature names, so scikit-learn warns and takes the columns by position, and
    so does the estimator (it failed with a bare KeyError('0')); mixed labels are refused
    with scikit-learn's TypeError."""
    A, y = _table()
    named = pd.DataFrame(A, columns=["0", "1", "2"])
    est = FedForestRegressor(n_estimators=3, random_state=0).fit(named, y)
    rf = RandomForestRegressor(n_estimators=3, random_state=0).fit(named, y)
    for model in (est, rf):
        with pytest.warns(UserWarning, match=re.escape(
                f"X does not have valid feature names, but {type(model).__name__} was fitted "
                "with feature names")):
            got = model.predict(pd.DataFrame(A))
        np.testing.assert_array_equal(got, model.predict(named))
    mixed = pd.DataFrame(A, columns=["0", 1, 2])
    with pytest.raises(TypeError, match=r"Feature names are only supported if all input "
                                        r"features have string names"):
        est.predict(mixed)


def test_predict_refuses_a_complex_table_with_the_message_fit_gives() -> None:
    """fit refuses complex values ("Complex data not supported", scikit-learn's message);
    predict took their real part, silently."""
    A, y = _table()
    X = pd.DataFrame(A, columns=["a", "b", "c"])
    Xc = X.astype(complex) + 100j
    with pytest.raises(SchemaError) as at_fit:
        FedForestRegressor(n_estimators=2).fit(Xc, y)
    est = FedForestRegressor(n_estimators=2, random_state=0).fit(X, y)
    with pytest.raises(SchemaError) as at_predict:
        est.predict(Xc)
    assert str(at_predict.value) == str(at_fit.value)
    assert str(at_fit.value).startswith("Complex data not supported\n")
    cells = X.astype(object)
    cells.iloc[3, 1] = 1 + 2j  # one complex cell of a column of objects: fit failed with a
    for call in (est.predict, lambda t: FedForestRegressor().fit(t, y)):  # bare TypeError
        with pytest.raises(SchemaError, match=r"^Complex data not supported\n"):
            call(cells)


def test_predict_refuses_a_complex_cell_whatever_the_model_was_fitted_on() -> None:
    """A complex cell of an object column is refused with fit's message at predict also for a
    model fitted on an array and for a table whose labels are not strings (it failed with a
    bare TypeError there), and in an object array at fit and at predict alike."""
    A, y = _table()
    named = pd.DataFrame(A, columns=["a", "b", "c"])
    cells = named.astype(object)
    cells.iloc[3, 1] = 1 + 2j
    int_labels = pd.DataFrame(A).astype(object)
    int_labels.iloc[3, 1] = np.complex64(1 + 2j)
    arr = A.astype(object)
    arr[3, 1] = 1 + 2j
    on_array = FedForestRegressor(n_estimators=2, random_state=0).fit(A, y)
    on_names = FedForestRegressor(n_estimators=2, random_state=0).fit(named, y)
    for model, X in ((on_array, cells), (on_array, int_labels), (on_names, int_labels),
                     (on_array, arr), (on_names, arr)):
        with pytest.raises(SchemaError, match=r"^Complex data not supported\n"):
            model.predict(X)
    with pytest.raises(SchemaError, match=r"^Complex data not supported\n"):
        FedForestRegressor(n_estimators=2).fit(arr, y)


def test_refuse_complex_reads_object_cells_and_categories_and_skips_text() -> None:
    """refuse_complex finds a complex value in an object column (Python's or NumPy's complex,
    in any column of a table with repeated labels), a complex column and complex categories;
    text, categorical text, numbers and objects that are numbers pass."""
    from fedforest_secure._estimator_inputs import refuse_complex

    n = 5
    base = pd.DataFrame({"x": np.arange(n, dtype=float), "s": pd.array(list("abcde"), "str"),
                         "k": pd.Categorical(list("ababa")), "o": np.arange(n).astype(object)})
    refuse_complex(base)
    refuse_complex(base["o"])
    refuse_complex(pd.DataFrame({"s": ["1+2j"] * n}))  # text, not a complex value
    bad = [pd.DataFrame({"x": np.arange(n, dtype=complex)}),
           base.assign(o=[1.0, 2.0, 3j, 4.0, 5.0]),
           base.assign(o=[1.0, 2.0, np.complex64(3j), 4.0, 5.0]),
           base.assign(k=pd.Categorical([1 + 2j, 3, 3, 3, 3])),
           base.assign(k=pd.Categorical(["a", 1 + 2j, "a", "a", "a"])),
           pd.concat([base, base.assign(o=[0, 0, 0, 0, 2j])], axis=1)]
    for table in bad:
        with pytest.raises(SchemaError, match=r"^Complex data not supported\n"):
            refuse_complex(table)
    with pytest.raises(SchemaError, match=r"^Complex data not supported\n"):
        refuse_complex(bad[1]["o"])


def test_refuse_complex_reads_only_object_columns_in_place() -> None:
    """A table of float columns and one object column is checked without converting the
    float columns to Python objects or copying the table: the check's peak allocation stays
    far below the size of the table (it boxed all 1.1 million cells, about 50 MB)."""
    import tracemalloc

    from fedforest_secure._estimator_inputs import refuse_complex

    n = 100_000
    table = pd.DataFrame(np.random.default_rng(0).normal(size=(n, 10)),
                         columns=[f"c{i}" for i in range(10)])
    table["site"] = pd.Series(np.array(["a", "b"], dtype=object)[np.arange(n) % 2],
                              dtype=object)
    tracemalloc.start()
    try:
        refuse_complex(table)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < table.memory_usage(deep=False).sum() / 10
