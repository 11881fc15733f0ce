"""Saving and loading the estimators in the one model file format of
:mod:`fedforest_secure.model`: a file an estimator saved (with its parameters, privacy profile
and job configuration), a federated job's model (its classes put in sorted order), and the
estimator files written before that format."""

from __future__ import annotations

import dataclasses
import json
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ._estimator_rows import _EstimatorRows
from ._model_files import model_document
from .config import JobConfig
from .files import write_atomic
from .model import ForestModel

_OLD_FORMAT = "fedforest-secure/estimator/v1"  # files written before the one model format


def _rule_method(section: dict[str, Any]) -> Any:
    """The saved parameters, with a ``method`` of ``"quantiles"`` that the fitted forest did
    not use read as None: a file saved when "quantiles" was the default, whose forest took the
    DP allocation rule's method. Refitted, the estimator takes the rule's method again."""
    params = section["params"]
    config = section.get("config")
    if isinstance(params, dict) and params.get("method") == "quantiles" \
            and isinstance(config, dict) and config.get("method") not in (None, "quantiles"):
        return {**params, "method": None}
    return params


class _EstimatorFiles(_EstimatorRows):
    """The estimators' ``save`` and ``load``."""

    _task: ClassVar[str]  # "regression" or "classification", set by each estimator
    profile: Any  # the estimator's parameter
    # set by fit or load
    config_: JobConfig
    profile_: Any
    _file_model: ForestModel  # the job's model file as read, where load sorted its classes

    if TYPE_CHECKING:  # scikit-learn's BaseEstimator provides it
        def get_params(self, deep: bool = True) -> dict[str, Any]: ...

    def save(self, path: str | Path) -> None:
        """Write the fitted estimator as a model file (:mod:`fedforest_secure.model`): the
        forest with its labels and feature names, plus the parameters, privacy profile and job
        configuration. An estimator read from a federated job's model file, which records no
        parameters or profile, writes that file as it was (claiming none)."""
        model = self._check_fitted()
        if not hasattr(self, "profile_"):  # loaded from a file without an estimator section
            write_atomic(path, getattr(self, "_file_model", model).to_json())
            return
        # numpy scalars (a search over np.arange(...)) as the JSON numbers they stand for
        params = {k: v.item() if isinstance(v, np.generic) else v
                  for k, v in self.get_params().items()}
        params["profile"] = getattr(self, "profile_", params["profile"])
        config = getattr(self, "config_", None)
        if not isinstance(params["random_state"], Integral | None) and config is not None:
            params["random_state"] = config.random_state
        section = {"class": type(self).__name__, "params": params,
                   "config": None if config is None else json.loads(config.to_json())}
        write_atomic(path, dataclasses.replace(model, estimator=section).to_json())

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a model file: one this estimator saved, or a federated job's model (the
        server's, ``fedforest model download``'s, a client's ``--out``).

        Raises
        ------
        ValueError
            Not a model file, a file whose parts do not fit together (the message names the
            field and the tree, :meth:`ForestModel.from_dict`), or a forest of the other task
            (a regression forest is read by :class:`FedForestRegressor`, a classification
            forest by :class:`FedForestClassifier`).
        """
        doc = model_document(path)
        try:
            if isinstance(doc, dict) and doc.get("format") == _OLD_FORMAT:
                return cls._load_old(doc)
            model = ForestModel.from_dict(doc)
        except KeyError as exc:
            raise ValueError(f"{path}: not a model file: no {exc.args[0]!r} field") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if model.task != cls._task:  # ForestModel refuses a task other than these two
            other = {"regression": "FedForestRegressor",
                     "classification": "FedForestClassifier"}[model.task]
            raise ValueError(f"{path} holds a {model.task} forest: read it with {other}.load")
        section = model.estimator or {}
        if section and (not isinstance(section, dict) or section.get("class") != cls.__name__):
            saved_by = section.get("class") if isinstance(section, dict) else None
            raise ValueError(f"{path} was saved by {saved_by}, not {cls.__name__}")
        if section and "params" not in section:
            raise ValueError(f"{path}: estimator has no 'params' field (the estimator's "
                             "parameters)")
        est = cls._from_params(_rule_method(section), path) if section else cls()
        est.model_ = dataclasses.replace(model, estimator=None)
        if not section:  # a job's model: classes in the schema's order
            sorted_model = _classes_sorted(est.model_)
            if sorted_model is not est.model_:
                est._file_model = est.model_  # what save writes back
                est.model_ = sorted_model
        if section.get("config") is not None:
            try:
                est.config_ = JobConfig.from_json(json.dumps(section["config"]))
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{path}: estimator.config is not a job configuration: "
                                 f"{exc}") from None
        if section:
            est.profile_ = section["params"].get("profile", est.profile)
        est._set_fitted_attributes()
        return est

    @classmethod
    def _from_params(cls, params: Any, path: str | Path) -> Any:
        """The estimator of a model file's ``estimator.params``; a ValueError naming the file
        for a parameter this estimator does not have."""
        if not isinstance(params, dict):
            raise ValueError(f"{path}: estimator.params must be a mapping of parameters, got "
                             f"{params!r}")
        known = cls().get_params()
        unknown = sorted(str(k) for k in params if k not in known)
        if unknown:
            raise ValueError(f"{path}: estimator.params: unknown parameter "
                             f"{', '.join(map(repr, unknown))} of {cls.__name__} (its "
                             f"parameters are {', '.join(sorted(known))})")
        return cls(**params)

    def _set_fitted_attributes(self) -> None:
        model = self.model_
        self.n_features_in_ = model.n_features
        if model.feature_names is not None:
            self.feature_names_in_ = np.array(model.feature_names, dtype=object)
        self.clients_ = np.array(model.clients if model.clients is not None
                                 else list(range(max(model.n_clients, 1))))
        self.n_clients_ = len(self.clients_)
        if model.task == "classification":
            self.classes_ = np.array(model.classes if model.classes is not None
                                     else list(range(model.n_classes)))
            self.n_classes_ = int(self.classes_.size)
        self.n_outputs_ = 1
        self.y_offset_ = model.y_offset

    @classmethod
    def _load_old(cls, doc: dict[str, Any]) -> Any:
        if doc.get("class") != cls.__name__:
            raise ValueError(f"not a saved {cls.__name__} (saved by {doc.get('class')})")
        params = dict(_rule_method(doc))
        if params.get("max_features") == "auto":  # files written before scikit-learn 1.4 names
            params.pop("max_features")
        est = cls(**params)
        model = ForestModel.from_dict(doc["model"])
        est.model_ = dataclasses.replace(
            model, clients=doc["clients"], classes=doc.get("classes"),
            feature_names=doc.get("feature_names"), y_offset=float(doc.get("y_offset", 0.0)))
        est.config_ = JobConfig.from_json(json.dumps(doc["config"]))
        est.profile_ = doc["params"]["profile"]
        est._set_fitted_attributes()
        return est


def _classes_sorted(model: ForestModel) -> ForestModel:
    """``model`` with its classes in sorted order, the trees' class columns to match (as
    scikit-learn's classifiers keep ``classes_``, and its metrics read probability columns);
    ``model`` itself if they are sorted already or cannot be compared."""
    if model.task != "classification" or not model.classes:
        return model
    try:
        order = sorted(range(len(model.classes)), key=lambda i: model.classes[i])  # type: ignore[index]
    except TypeError:  # labels of mixed kinds: kept as they are
        return model
    if order == list(range(len(order))):
        return model
    trees = [dataclasses.replace(t, value=t.value[:, order]) for t in model.trees]
    return dataclasses.replace(model, trees=trees, classes=[model.classes[i] for i in order])
