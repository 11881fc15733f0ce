"""Readable messages for configuration files that do not validate.

pydantic says ``Extra inputs are not permitted`` for a misspelt key; a person editing a TOML file
needs the section, the key, and the keys that *are* allowed there. :func:`explain` turns a
:class:`~pydantic.ValidationError` into one line per problem::

    [forest] n_estimator: unknown key; allowed: bootstrap, criterion, ... (did you mean
    'n_estimators'?)
    round_deadline: Input should be greater than 0
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["allowed_keys", "explain", "file_key", "submodel_at"]


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """The keys a file may use for ``model``: each field's alias if it has one, else its name."""
    return sorted(file_key(name, f) for name, f in model.model_fields.items())


def file_key(name: str, field: Any) -> str:
    """The key a configuration file uses for the model field ``name``."""
    extra = field.json_schema_extra
    if isinstance(extra, Mapping) and isinstance(extra.get("file_key"), str):
        return str(extra["file_key"])  # the key a file uses when a loader renames it
    alias = field.validation_alias
    if isinstance(alias, str):
        return alias
    choices = getattr(alias, "choices", None)
    if choices and isinstance(choices[0], str):
        return str(choices[0])
    return str(field.alias or name)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, list, dict, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin is not None or isinstance(annotation, types.UnionType):
        for arg in typing.get_args(annotation):
            out.extend(_models_in(arg))
    return out


def submodel_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that validates the mapping at ``loc`` (list indices skipped), or None."""
    current: type[BaseModel] | None = model
    for key in loc:
        if current is None:
            return None
        if isinstance(key, int):
            continue
        by_key = {file_key(n, f): f for n, f in current.model_fields.items()}
        by_key.update(current.model_fields)
        field = by_key.get(key)
        if field is None:
            return None
        found = _models_in(field.annotation)
        current = found[0] if found else None
    return current


def _where(loc: Sequence[int | str], data: Any) -> str:
    """``[forest] max_depth`` / ``[[features]] #3 ('chol') bounds`` / ``round_deadline``."""
    parts: list[str] = []
    section: list[str] = []
    node = data
    keys = list(loc)
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(key, int):
            label = f"#{key + 1}"
            if isinstance(node, Sequence) and not isinstance(node, str) and key < len(node):
                node = node[key]
                name = node.get("name") if isinstance(node, Mapping) else None
                if isinstance(name, str):
                    label += f" ({name!r})"
            if section:
                section[-1] = f"[[{section[-1].strip('[]')}]] {label}"
            continue
        nxt = node.get(key) if isinstance(node, Mapping) else None
        if not last and isinstance(nxt, Mapping | list):
            section.append(f"[{key}]")
        else:
            parts.append(str(key))
        node = nxt
    return " ".join(section + [".".join(parts)]).strip()


def explain(exc: ValidationError, model: type[BaseModel], data: Any = None) -> str:
    """One ``location: problem`` per error, ``; ``-separated. Unknown keys list the allowed
    ones (and the closest match)."""
    out: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _where(loc, data)
        if err["type"] == "extra_forbidden":
            owner = submodel_at(model, loc[:-1])
            msg = "unknown key"
            if owner is not None:
                keys = allowed_keys(owner)
                msg += f"; allowed: {', '.join(keys)}"
                near = difflib.get_close_matches(str(loc[-1]), keys, n=1)
                if near:
                    msg += f" (did you mean {near[0]!r}?)"
        elif err["type"] == "missing":
            msg = "required key missing"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            if isinstance(err.get("input"), bool) and err["type"].endswith("_type"):
                msg += f", not {str(err['input']).lower()}"  # TOML's true where a number is due
        out.append(f"{where}: {msg}" if where else msg)
    return "; ".join(out)
