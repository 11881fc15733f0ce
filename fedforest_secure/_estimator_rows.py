"""How a FedForest estimator reads the rows it is given: the sites named by ``client=`` as
codes (at fit, the sites it learns; after it, the sites it knows, by name or by index), and the
``X`` to predict checked against the fit (columns by name, width, categorical levels), with the
error a method of an unfitted estimator raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils.validation import check_array, validate_data

from ._cells import no_value
from ._estimator_inputs import as_schema_error, refuse_complex, refuse_dates
from .errors import NotFittedError, SchemaError
from .model import ForestModel, _column_names


def _check_label_kinds(labels: list[Any]) -> None:
    """Refuse client labels that mix text and numbers: ``1`` and ``"1"`` would otherwise
    become one site (numpy makes both text) or fail to sort."""
    text = [lab for lab in labels if isinstance(lab, str)]
    if text and len(text) < len(labels):
        other = next((lab for lab in labels if not isinstance(lab, str)
                      and not no_value(lab)), None)
        if other is None:  # text and missing labels: the missing ones are named later
            return
        raise SchemaError(f"client mixes text and numbers (e.g. {text[0]!r} and {other!r}): "
                          "give every row's institution the same kind of label")



class _EstimatorRows:
    """The estimators' reading of ``client=`` and of the ``X`` to predict."""

    # set by fit or load
    model_: ForestModel
    clients_: np.ndarray

    def _client_codes(self, client: Any, n: int, fitting: bool) -> np.ndarray:
        if client is None:
            if fitting:
                self.clients_ = np.array([0])
            return np.zeros(n, dtype=np.int64)
        given = client
        client = np.asarray(client)
        if client.dtype.kind in "OU":
            _check_label_kinds(client.tolist() if client.dtype.kind == "O" or
                               isinstance(given, np.ndarray) else list(given))
        if client.shape != (n,):
            raise SchemaError(f"client must have shape ({n},), got {client.shape}")
        if client.dtype.kind == "f":
            holes = np.flatnonzero(np.isnan(client))
        elif client.dtype.kind == "O":
            holes = np.flatnonzero([no_value(c) for c in client.tolist()])
        else:
            holes = np.zeros(0, dtype=np.int64)
        if holes.size:
            shown = ", ".join(str(r) for r in holes[:10]) + (", ..." if holes.size > 10 else "")
            raise SchemaError(f"client has no value at {holes.size} "
                              f"row{'s' if holes.size > 1 else ''} ({shown}): every row "
                              "needs the institution it comes from")
        if fitting:
            self.clients_ = np.unique(client)
        # a forest that never splits on the site predicts rows of any site, a new one too
        strict = fitting or self.model_.uses_client
        if not fitting and client.dtype.kind in "iu" and self.clients_.dtype.kind in "OU" \
                and not any(str(c).strip().lstrip("+-").isdigit()
                            for c in self.clients_.tolist()):
            # sites named by words: an integer is an index. Names that read as numbers
            # ("1", "2") are matched as names only: an index would pick another site
            return self._site_indices(client, strict)
        # clients_ is in index order: sorted after fit, the job's order for a job's model
        index = {c: i for i, c in enumerate(self.clients_.tolist())}
        codes = np.empty(n, dtype=np.int64)
        for r, c in enumerate(client.tolist()):
            k = index.get(c)
            if k is None:
                if strict:
                    raise SchemaError(f"unknown client {c!r}; the forest knows "
                                      f"{self.clients_.tolist()}")
                k = -1
            codes[r] = k
        return codes

    def _site_indices(self, client: np.ndarray, strict: bool) -> np.ndarray:
        """Integers where the sites have word names (a job's model): their indices in
        ``clients_``, as :meth:`ForestModel.predict` takes them; -1 for an index beyond them,
        refused if ``strict``. Not called where a name reads as a number."""
        codes = client.astype(np.int64)
        bad = (codes < 0) | (codes >= len(self.clients_))
        if bad.any():
            if strict:
                names = ", ".join(repr(c) for c in self.clients_.tolist())
                raise SchemaError(f"unknown client {int(codes[bad][0])}; the forest knows "
                                  f"sites 0 to {len(self.clients_) - 1} ({names}), by index "
                                  "or name")
            codes[bad] = -1
        return codes

    def _check_fitted(self) -> ForestModel:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        model: ForestModel = self.model_
        return model

    def read_rows(self, path: str | Path) -> np.ndarray:
        """A site's CSV file as rows to predict on, read by the model's schema as the site's
        client reads the file (:meth:`Schema.read_csv`): cells as text (a level spelled
        ``None`` or ``NA`` stays that level, ``01`` stays ``01``), column names stripped,
        the target, the client column and columns the schema does not name left out. A
        general-purpose reader such as ``pandas.read_csv`` guesses missing values and
        numbers, and so reads such a file otherwise.

        Returns
        -------
        X : ndarray of object, shape (n_samples, n_features_in_)
            The text cells of the model's features, in the model's column order: what
            ``predict``, ``predict_proba``, ``apply`` and ``score`` take.

        Raises
        ------
        SchemaError
            The file cannot be read, misses a feature's column, or holds a cell that is no
            number or no level of its column (naming the file and its line; values outside
            the schema's public bounds are read); a model without a schema (one fitted in
            process).
        """
        model = self._check_fitted()
        if model.schema is None:
            raise SchemaError("read_rows reads a site's CSV file by the schema of a federated "
                              "job's model; this model has none (fitted in process): read the "
                              "file with pandas")
        from ._schema_tables import feature_cells
        from .schema import Schema

        return feature_cells(Schema.from_dict(model.schema, stored=True), path)

    def _validate_X_predict(self, X: Any) -> np.ndarray:
        """``X`` checked against the fit. A table with named columns is matched to
        ``feature_names_in_`` by name (any order; a missing or unknown column is refused) and,
        for a federated job's model, categorical columns are read as levels
        (:meth:`ForestModel.prepare`); an array is taken by position."""
        model = self._check_fitted()
        refuse_dates(X)
        refuse_complex(X)  # as fit refuses it, not cut to its real part nor a bare TypeError
        names = _column_names(X)
        if model.schema is not None or (names is not None and model.feature_names is not None):
            if names is None and getattr(X, "columns", None) is not None:
                # labels that are not all strings: scikit-learn's warning (or its error for
                # mixed labels) and the columns taken by position, as validate_data does below
                as_schema_error(validate_data, self, X, reset=False, skip_check_array=True)
            Xp = model.prepare(X)
            out: np.ndarray = as_schema_error(check_array, Xp, dtype=np.float64,
                                               ensure_all_finite="allow-nan")
            return out
        out = as_schema_error(validate_data, self, X, reset=False, dtype=np.float64,
                               ensure_all_finite="allow-nan")
        return out

    def _predict_codes(self, client: Any, n: int, method: str) -> np.ndarray | None:
        """The sites' codes of ``n`` rows to predict (None without ``client``); a forest that
        splits on the site indicator H needs them."""
        if client is None:
            if self.model_.uses_client:
                raise ValueError("this forest splits on the client indicator H: pass client= "
                                 f"to {method}")
            return None
        return self._client_codes(client, n, False)

    def _values(self, X: Any, client: Any, method: str = "predict") -> np.ndarray:
        model = self._check_fitted()
        X = self._validate_X_predict(X)
        return model.values_of(X, self._predict_codes(client, X.shape[0], method))
