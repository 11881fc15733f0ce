"""Spread a non-federated table over clients (appendix "Benchmark on Public Datasets").

:func:`dirichlet_partition` spreads the rows over ``K`` clients with a Dirichlet allocation of
groups of similar rows (covariate shift controlled by ``alpha``); :func:`even_partition` cuts
them into ``K`` random, equal-sized shards (the Banknote fragmentation table, ``K = 1..100``).
Both return one client index ``0..K-1`` per row and draw only from the seed or generator they
are given, so results are deterministic given the seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._args import IntArray, SeedLike, as_rng, check_int

__all__ = ["dirichlet_partition", "even_partition"]


def _groups(values: NDArray[Any], n_groups: int, rng: np.random.Generator) -> IntArray:
    """Group rows for the Dirichlet allocation (see :func:`dirichlet_partition`)."""
    n = values.shape[0]
    if values.ndim == 1:
        if values.dtype.kind in "iubUSO":
            _, inv = np.unique(values, return_inverse=True)
            return inv.astype(np.int64)
        v = values.astype(np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError("y_or_X contains non-finite values")
        rank = np.empty(n, np.int64)
        rank[np.argsort(v, kind="stable")] = np.arange(n)
        groups: IntArray = (rank * n_groups) // n
        return groups
    X = values.astype(np.float64)
    if not np.all(np.isfinite(X)):
        raise ValueError("y_or_X contains non-finite values")
    sd = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    k = min(n_groups, np.unique(Z, axis=0).shape[0])
    if k <= 1:
        return np.zeros(n, np.int64)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=3, random_state=int(rng.integers(2**31 - 1)))
    labels: IntArray = np.asarray(km.fit_predict(Z), dtype=np.int64)
    return labels


def dirichlet_partition(
    y_or_X: ArrayLike,
    n_clients: int,
    alpha: float,
    rng: SeedLike,
    *,
    n_groups: int = 10,
    min_size: int = 2,
) -> IntArray:
    """Split rows over clients with a Dirichlet allocation (appendix "Benchmark on Public Data").

    The paper partitions each public dataset over ``K = 20`` clients "using a Dirichlet
    allocation" whose concentration ``alpha`` controls heterogeneity (0.1: strongly non-i.i.d.,
    pronounced covariate shift; 10: close to i.i.d.). Scheme used here:

    1. Rows are put into groups of similar rows:

       * ``X`` (2-D): k-means with ``n_groups`` clusters on the standardised features, so
         clients differ in their covariate distribution (covariate shift);
       * ``y`` of integer / bool / string dtype (1-D): one group per class (the label-skew
         scheme of Hsu et al., 2019);
       * ``y`` of float dtype (1-D): ``n_groups`` equal-count bins of the sorted values.

    2. For each group independently, client proportions ``p ~ Dir(alpha * 1_K)`` are drawn and
       the group's rows (in random order) are dealt to clients by a multinomial draw with
       probabilities ``p``. Small ``alpha`` puts each group almost entirely on one or two
       clients; large ``alpha`` spreads every group evenly.
    3. Any client left with fewer than ``min_size`` rows takes random rows from the currently
       largest client until it has ``min_size``.

    Parameters
    ----------
    y_or_X : array-like of shape (n_samples,) or (n_samples, n_features)
        Labels / targets or features that define the groups.
    n_clients : int
        Number of clients ``K``.
    alpha : float
        Dirichlet concentration, ``> 0``.
    rng : int, numpy.random.Generator or None
        Seed or generator.
    n_groups : int, default 10
        Number of k-means clusters (2-D input) or target bins (float 1-D input).
    min_size : int, default 2
        Minimum number of rows per client; ``n_samples >= n_clients * min_size`` is required.

    Returns
    -------
    ndarray of shape (n_samples,), int64
        Client index ``0..n_clients-1`` of each row (every row in exactly one client).
    """
    values = np.asarray(y_or_X)
    if values.ndim not in (1, 2):
        raise ValueError(f"y_or_X must be 1-D or 2-D, got shape {values.shape}")
    n = values.shape[0]
    K = check_int(n_clients, "n_clients", 1)
    n_groups = check_int(n_groups, "n_groups", 1)
    min_size = check_int(min_size, "min_size", 0)
    if isinstance(alpha, bool) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if n < K * max(min_size, 1):
        raise ValueError(
            f"{n} rows cannot give {K} clients at least {max(min_size, 1)} rows each"
        )
    gen = as_rng(rng)
    groups = _groups(values, n_groups, gen)
    client = np.empty(n, np.int64)
    for g in np.unique(groups):
        rows = gen.permutation(np.flatnonzero(groups == g))
        p = gen.dirichlet(np.full(K, float(alpha)))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # underflow for tiny alpha
            p = np.zeros(K)
            p[gen.integers(K)] = 1.0
        counts = gen.multinomial(rows.size, p / p.sum())
        client[rows] = np.repeat(np.arange(K, dtype=np.int64), counts)
    sizes = np.bincount(client, minlength=K)
    while (small := np.flatnonzero(sizes < min_size)).size:
        k = int(small[0])
        donor = int(np.argmax(sizes))
        need = int(min(min_size - sizes[k], sizes[donor] - min_size))
        moved = gen.choice(np.flatnonzero(client == donor), size=need, replace=False)
        client[moved] = k
        sizes[k] += need
        sizes[donor] -= need
    return client


def even_partition(n: int, n_clients: int, rng: SeedLike) -> IntArray:
    """Deal ``n`` rows at random into ``n_clients`` shards of equal size (+-1).

    Used for the Banknote fragmentation table (appendix "Performance in Highly Fragmented
    Settings", ``K = 1, 2, 5, 10, 20, 50, 100``).

    Parameters
    ----------
    n : int
        Number of rows.
    n_clients : int
        Number of clients, ``1 <= n_clients <= n``.
    rng : int, numpy.random.Generator or None
        Seed or generator.

    Returns
    -------
    ndarray of shape (n,), int64
        Client index of each row; client sizes differ by at most one.
    """
    n = check_int(n, "n", 1)
    K = check_int(n_clients, "n_clients", 1)
    if K > n:
        raise ValueError(f"n_clients={K} exceeds the number of rows n={n}")
    perm = as_rng(rng).permutation(n)
    client = np.empty(n, np.int64)
    for k, chunk in enumerate(np.array_split(perm, K)):
        client[chunk] = k
    return client
