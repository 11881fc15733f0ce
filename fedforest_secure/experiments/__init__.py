"""Experiments: the tables the paper's benchmarks use, the baselines, and utility comparisons.

No network code, no drawing: these return data; the benchmarks (``benchmarks/``) and the
``fedforest compare`` command render it.

================  ===================================================================
``tables``        :class:`Dataset` / :class:`TrainTest`, what every loader returns
``loaders``       real datasets by name (scikit-learn's, and the paper's benchmark sets read
                  in place from ``$FEDFOREST_DATA_DIR`` or ``../shared/data``)
``partitions``    a non-federated table spread over clients (Dirichlet, even shards)
``synthetic``     the paper's synthetic multicentre settings
``baselines``     local learning, local ensembling (Hauschild et al.), centralised forests
``compare``       FedForest profiles against central DP and plain baselines, scored per seed
================  ===================================================================
"""

from __future__ import annotations

from .baselines import (
    CentralizedRF,
    LocalEnsemble,
    LocalEnsembleClassifier,
    LocalEnsembleRegressor,
    LocalLearning,
    LocalLearningClassifier,
    LocalLearningRegressor,
)
from .loaders import (
    DATA_DIR_ENV,
    DataNotFoundError,
    available_datasets,
    load_dataset,
    load_fed_heart_disease,
    load_heart_disease_with_missing,
    shared_data_dir,
)
from .partitions import dirichlet_partition, even_partition
from .synthetic import (
    SYNTHETIC_SETTINGS,
    TreeFunction,
    contaminate_outliers,
    make_disjoint_supports,
    make_federated_regression,
    make_overlapping_supports,
    tree_distilled_f,
)
from .tables import Dataset, DatasetInfo, TrainTest

__all__ = [
    "DATA_DIR_ENV",
    "SYNTHETIC_SETTINGS",
    "CentralizedRF",
    "DataNotFoundError",
    "Dataset",
    "DatasetInfo",
    "LocalEnsemble",
    "LocalEnsembleClassifier",
    "LocalEnsembleRegressor",
    "LocalLearning",
    "LocalLearningClassifier",
    "LocalLearningRegressor",
    "TrainTest",
    "TreeFunction",
    "available_datasets",
    "contaminate_outliers",
    "dirichlet_partition",
    "even_partition",
    "load_dataset",
    "load_fed_heart_disease",
    "load_heart_disease_with_missing",
    "make_disjoint_supports",
    "make_federated_regression",
    "make_overlapping_supports",
    "shared_data_dir",
    "tree_distilled_f",
]
