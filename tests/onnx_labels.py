"""Checking an ONNX model's ``label`` output against the estimator's ``predict``."""

from __future__ import annotations

import numpy as np

#: Two class probabilities this close are a tie up to the rounding of the trees' sum: the
#: runtime adds the trees in another order, so either class may come out first.
TIE = 1e-12


def assert_labels_match(labels: np.ndarray, proba: np.ndarray, classes: np.ndarray,
                        predicted: np.ndarray) -> None:
    """``labels`` (the ONNX model's) equal ``predicted`` on every row whose largest probability
    in ``proba`` leads the next by more than :data:`TIE`; on a row within it, the ONNX label is
    one of the classes tied for the largest probability."""
    best = proba.max(axis=1, keepdims=True)
    tied = proba >= best - TIE
    clear = tied.sum(axis=1) == 1
    np.testing.assert_array_equal(labels[clear], predicted[clear])
    rows = np.flatnonzero(~clear)
    for r in rows:
        assert labels[r] in classes[tied[r]], (r, labels[r], proba[r])
