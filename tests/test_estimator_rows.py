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
