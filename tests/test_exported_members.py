"""The public names of fedforest_secure (DESIGN.md, 'Public names')."""

from __future__ import annotations

import importlib

import fedforest_secure

EXPECTED = [
    "FedForestClassifier",
    "FedForestError",
    "FedForestRegressor",
    "ForestModel",
    "load_profile",
]


def test_all_is_pinned() -> None:
    assert sorted(fedforest_secure.__all__) == EXPECTED
    assert len(set(fedforest_secure.__all__)) == len(fedforest_secure.__all__)


def test_every_name_importable() -> None:
    mod = importlib.import_module("fedforest_secure")
    ns: dict[str, object] = {}
    exec("from fedforest_secure import *", ns)  # noqa: S102 - what users write
    for name in EXPECTED:
        assert getattr(mod, name) is ns[name]


def test_public_objects_are_what_the_design_names() -> None:
    from fedforest_secure.errors import FedForestError, NotFittedError, SchemaError
    from fedforest_secure.estimators import FedForestClassifier, FedForestRegressor
    from fedforest_secure.model import ForestModel
    from fedforest_secure.privacy import PrivacyProfile, load_profile

    assert fedforest_secure.FedForestRegressor is FedForestRegressor
    assert fedforest_secure.FedForestClassifier is FedForestClassifier
    assert fedforest_secure.ForestModel is ForestModel
    assert fedforest_secure.load_profile is load_profile
    assert issubclass(SchemaError, fedforest_secure.FedForestError)
    assert issubclass(NotFittedError, FedForestError)
    assert isinstance(fedforest_secure.load_profile("secure-dp", epsilon=2.0), PrivacyProfile)
    assert hasattr(fedforest_secure.FedForestClassifier(), "predict_proba")
    assert isinstance(fedforest_secure.__version__, str)
