"""The tables experiments feed to a forest: :class:`Dataset`, :class:`TrainTest` and their info.

Loaders (:mod:`.loaders`), partitions (:mod:`.partitions`) and the synthetic settings
(:mod:`.synthetic`) all produce these. Client numbering: clients are indexed ``0..K-1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._args import TASKS, FloatArray, IntArray, Task

__all__ = ["Dataset", "DatasetInfo", "TrainTest"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A table ready for a forest.

    Parameters
    ----------
    name : str
        Dataset name (as passed to :func:`~.loaders.load_dataset`, or the generator's setting).
    X : ndarray of shape (n_samples, n_features), float64
        Features.
    y : ndarray of shape (n_samples,)
        Target: float64 for regression, int64 class codes ``0..n_classes-1`` for classification.
    task : {"regression", "classification"}
        Learning task.
    feature_names : tuple of str
        One name per column of ``X``.
    client : ndarray of shape (n_samples,), int64, or None
        Client (institution) index ``0..K-1`` of each row, or None for a non-federated table.
    classes : list or None
        For classification, the original label of each class code (``classes[code]``); None for
        regression.

    Notes
    -----
    Arrays are converted (copied if needed) to the documented dtypes and validated on creation.
    The dataclass is frozen, but the arrays themselves are ordinary numpy arrays.
    """

    name: str
    X: FloatArray
    y: NDArray[Any]
    task: Task
    feature_names: tuple[str, ...]
    client: IntArray | None = None
    classes: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        X = np.asarray(self.X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
        n, d = X.shape
        y_raw = np.asarray(self.y)
        if y_raw.shape != (n,):
            raise ValueError(f"y must have shape ({n},), got {y_raw.shape}")
        names = tuple(str(s) for s in self.feature_names)
        if len(names) != d:
            raise ValueError(f"{len(names)} feature names for {d} features")
        if self.task == "regression":
            y = y_raw.astype(np.float64, copy=False)
            if self.classes is not None:
                raise ValueError("classes must be None for a regression dataset")
            classes = None
        else:
            if self.classes is None or len(self.classes) == 0:
                raise ValueError("a classification dataset needs its list of classes")
            y = y_raw.astype(np.int64, copy=False)
            if not np.array_equal(y, y_raw):
                raise ValueError("classification targets must be integer class codes")
            if n and (y.min() < 0 or y.max() >= len(self.classes)):
                raise ValueError(f"class codes must lie in 0..{len(self.classes) - 1}")
            classes = list(self.classes)
        client = None
        if self.client is not None:
            c_raw = np.asarray(self.client)
            if c_raw.shape != (n,):
                raise ValueError(f"client must have shape ({n},), got {c_raw.shape}")
            client = c_raw.astype(np.int64, copy=False)
            if not np.array_equal(client, c_raw) or (n and client.min() < 0):
                raise ValueError("client indices must be non-negative integers")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "feature_names", names)
        object.__setattr__(self, "client", client)
        object.__setattr__(self, "classes", classes)

    @property
    def n_samples(self) -> int:
        """Number of rows."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of feature columns."""
        return int(self.X.shape[1])

    @property
    def n_clients(self) -> int | None:
        """``max(client) + 1``, or None when the dataset carries no client column."""
        if self.client is None:
            return None
        return int(self.client.max()) + 1 if self.client.size else 0

    def with_client(self, client: ArrayLike) -> Dataset:
        """Return a copy of the dataset with ``client`` as its client column.

        Parameters
        ----------
        client : array-like of shape (n_samples,)
            Client index per row, e.g. from :func:`~.partitions.dirichlet_partition`.
        """
        return replace(self, client=np.asarray(client))

    def subset(self, rows: ArrayLike) -> Dataset:
        """Return the rows selected by an index array or a boolean mask (copies)."""
        idx = np.asarray(rows)
        return replace(
            self,
            X=self.X[idx],
            y=self.y[idx],
            client=None if self.client is None else self.client[idx],
        )


@dataclass(frozen=True, eq=False)
class TrainTest:
    """A training set and a held-out test set; unpacks as ``train, test = ...``."""

    train: Dataset
    test: Dataset

    def __iter__(self) -> Iterator[Dataset]:
        return iter((self.train, self.test))


@dataclass(frozen=True)
class DatasetInfo:
    """One entry of :func:`~.loaders.available_datasets`.

    Attributes
    ----------
    name : str
        Name accepted by :func:`~.loaders.load_dataset`.
    task : {"regression", "classification"}
        Learning task.
    needs_shared_data : bool
        True when the data are read from the shared data directory (``../shared/data``); False
        for datasets that ship with scikit-learn.
    description : str
        Origin and shape.
    """

    name: str
    task: Task
    needs_shared_data: bool
    description: str
