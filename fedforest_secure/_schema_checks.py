"""The checks a schema's fields pass, and the message a failed schema validation makes.

Column names carry no surrounding spaces; public bounds are finite with ``lo < hi``; levels and
classes are at least two distinct, trimmed labels, no two of them the same number (``"1"`` and
``"1.0"``: a cell written ``1.0`` matches the label ``"1"``) unless the schema is one a model or
a job already carries (``stored``). A pydantic ``ValidationError``
becomes one line naming every offending field, e.g. ``features[2] ('age').bounds: ...``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, StrictFloat, ValidationError

from ._cells import _canon, _number
from .config_errors import allowed_keys, submodel_at

_Bounds = tuple[StrictFloat, StrictFloat]


def _check_bounds(bounds: tuple[float, float] | None) -> None:
    if bounds is None:
        return
    lo, hi = bounds
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"bounds must be finite, got [{lo}, {hi}]")
    if not lo < hi:
        raise ValueError(f"lower bound must be < upper bound, got [{lo}, {hi}]")
    if not math.isfinite(hi - lo):
        raise ValueError(f"bounds [{lo}, {hi}] are wider than the largest float: give the "
                         "column's plausible range (the grids and sketches cut its width)")


def _check_labels(labels: list[str], what: str, *, stored: bool = False) -> None:
    """``stored``: labels of a schema a model or a job already carries, read as written (their
    number twins were allowed when it was written); a schema written or adopted now lists
    each number once."""
    if len(labels) < 2:
        raise ValueError(f"needs at least 2 {what}, got {len(labels)}")
    if any(not s.strip() or s != s.strip() for s in labels):
        raise ValueError(f"{what} must be non-empty strings without surrounding spaces")
    dups = sorted(lab for lab, count in Counter(labels).items() if count > 1)
    if dups:
        raise ValueError(f"duplicate {what}: {dups}")
    twins = number_twins(labels)
    if twins and not stored:
        first, second = twins[0]
        one = "class" if what == "classes" else "category"
        raise ValueError(
            f"{what} {first!r} and {second!r} are the same number: sites that write it "
            f"as {first} and as {second} would give one {one} two codes (a cell matches "
            "a label by its number); list each number once")


def number_twins(labels: list[str]) -> list[tuple[str, str]]:
    """The pairs of ``labels`` that are the same number (``("1", "1.0")``), each with the
    label listed first."""
    seen: dict[str, str] = {}
    out = []
    for lab in labels:
        key = _numeric_key(lab)
        if key is None:
            continue
        if key in seen:
            out.append((seen[key], lab))
        else:
            seen[key] = lab
    return out


def _numeric_key(label: str) -> str | None:
    """The canonical text of the number ``label`` reads as (``"1.0"``, ``"01"``: ``"1"``), as a
    cell's number is matched to the labels; None for a label that is no number."""
    try:
        return _canon(_number(label))
    except ValueError:
        return None


def _check_name(name: str) -> None:
    if not name.strip() or name != name.strip():
        raise ValueError(f"name must be non-empty without surrounding spaces, got {name!r}")


def _name_field(cls: type[BaseModel], v: str) -> str:
    _check_name(v)
    return v


def _bounds_field(
    cls: type[BaseModel], v: tuple[float, float] | None
) -> tuple[float, float] | None:
    _check_bounds(v)
    return v


def _format_error(exc: ValidationError, data: Any, model: type[BaseModel]) -> str:
    """What is wrong, field by field: ``target.classes: ...; features[2] ('age').bounds: ...``.

    ``model`` is the validated model; an unknown key's message lists the keys its table allows.
    """
    parts = []
    for err in exc.errors():
        loc: list[str] = []
        for i, key in enumerate(err["loc"]):
            if isinstance(key, int) and loc:
                loc[-1] += f"[{key}]"
                if err["loc"][:i] == ("features",) and isinstance(data, Mapping):
                    feats = data.get("features")
                    if isinstance(feats, list) and key < len(feats):
                        name = feats[key].get("name") if isinstance(feats[key], Mapping) else None
                        if isinstance(name, str):
                            loc[-1] += f" ({name!r})"
            else:
                loc.append(str(key))
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            owner = submodel_at(model, err["loc"][:-1])
            msg = "unknown key"
            if owner is not None:
                msg += f"; allowed: {', '.join(allowed_keys(owner))}"
        parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    return "; ".join(parts)
