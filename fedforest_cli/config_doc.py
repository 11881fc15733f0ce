"""The key reference of docs/configuration.md, generated from the pydantic models.

The page is prose written by hand with generated tables between markers::

    <!-- BEGIN GENERATED job.forest -->
    ...
    <!-- END GENERATED job.forest -->

:func:`render` replaces what is between each pair of markers with the table of the named
section; ``python -m fedforest_cli.config_doc`` rewrites the page in place, and the test suite
checks that the page equals its own rendering, so a key added to a model without its row in
the documentation fails the tests.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedforest_secure.config_errors import file_key
from fedforest_secure.privacy import available_profiles, load_profile
from fedforest_secure.privacy.profile import DPConfig, PrivacyProfile
from fedforest_secure.schema import Feature, Schema, Target
from server_app.evaljob import EvaluationParams
from server_app.jobspec import DataFacts, ForestParams, JobSpec
from server_app.settings import ServerSettings, TLSSettings

__all__ = ["DOC_PATH", "SECTIONS", "describe_fields", "main", "render"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
_BLOCK = re.compile(r"(<!-- BEGIN GENERATED (?P<name>[\w.]+) -->\n)(?P<body>.*?)"
                    r"(<!-- END GENERATED (?P=name) -->)", re.S)


# ---------------------------------------------------------------------- field descriptions
def _docstring_attributes(model: type[BaseModel]) -> dict[str, str]:
    """``name -> text`` from the numpydoc ``Attributes`` section of the model's docstring."""
    doc = model.__doc__ or ""
    m = re.search(r"Attributes\n\s*-+\n(?P<body>.*)", doc, re.S)
    if m is None:
        return {}
    out: dict[str, str] = {}
    current: str | None = None
    for line in m.group("body").splitlines():
        head = re.match(r"^\s{4}(\w+) : ", line)
        if head:
            current = head.group(1)
            out[current] = ""
        elif current is not None and line.strip():
            out[current] = (out[current] + " " + line.strip()).strip()
        elif not line.strip() and current is not None and out[current]:
            current = None
    return out


def describe_fields(model: type[BaseModel]) -> dict[str, str]:
    """Every field's description: ``Field(description=...)``, else the docstring's
    ``Attributes`` entry; an empty string where neither says anything."""
    from_doc = _docstring_attributes(model)
    return {name: (f.description or from_doc.get(name, "")).strip().replace("``", "`")
            for name, f in model.model_fields.items()}


# ---------------------------------------------------------------------- types and defaults
def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        return " \\| ".join(_type(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is tuple:
        return "[lo, hi]" if len(args) == 2 else "list"
    if origin is dict:
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    names = {bool: "bool", int: "int", float: "float", str: "string", Path: "path"}
    if isinstance(annotation, type) and annotation in names:
        return names[annotation]
    return str(annotation)


def _limits(field: FieldInfo) -> str:
    out = []
    for meta in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            val = getattr(meta, attr, None)
            if val is not None:
                out.append(f"{sym} {val:,}" if isinstance(val, int) else f"{sym} {val:g}")
        if isinstance(meta, annotated_types.MinLen) and meta.min_length:
            out.append(f"at least {meta.min_length}")
        if isinstance(meta, annotated_types.MaxLen):
            out.append(f"at most {meta.max_length:,}")
    return ", ".join(out)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, float):
        return f"`{v:.4g}`"
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, list | tuple):
        return "`[]`" if not v else "`[" + ", ".join(_value(x).strip("`") for x in v) + "]`"
    return f"`{v}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(made, BaseModel | dict) else _value(made)
    if field.default is PydanticUndefined:
        return "**required**"
    if field.default is None:
        return ""
    return _value(field.default)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def field_table(model: type[BaseModel], *, skip: tuple[str, ...] = ()) -> str:
    """``| key | type | default | meaning |`` for every field of ``model``."""
    desc = describe_fields(model)
    keys = {name: file_key(name, f) for name, f in model.model_fields.items()}
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        typ = _type(field.annotation)
        lim = _limits(field)
        if lim:
            typ += f" ({lim})"
        rows.append(f"| `{keys[name]}` | {typ} | {_default(field)} | {_escape(desc[name])} |")
    return "\n".join(rows) + "\n"


def privacy_table() -> str:
    """The ``[privacy]`` overrides: every profile and ``[dp]`` key, with each shipped
    profile's value."""
    profiles = {name: load_profile(name).to_dict() for name in available_profiles()}
    head = "| key | type | " + " | ".join(f"`{p}`" for p in profiles) + " | meaning |"
    rows = [head, "|---|---|" + "---|" * len(profiles) + "---|"]

    def add(model: type[BaseModel], get: Callable[[dict[str, Any], str], Any],
            prefix: str = "") -> None:
        desc = describe_fields(model)
        for name, field in model.model_fields.items():
            if name in ("dp", "description"):  # the section itself; a free-text label
                continue
            vals = []
            for prof in profiles.values():
                v = get(prof, name)
                vals.append("" if v is None else _value(v))
            rows.append(f"| `{prefix}{name}` | {_type(field.annotation)} | " + " | ".join(vals)
                        + f" | {_escape(desc[name])} |")

    add(PrivacyProfile, lambda p, k: p.get(k))
    add(DPConfig, lambda p, k: (p.get("dp") or {}).get(k))
    return "\n".join(rows) + "\n"


#: Section name -> the text between its markers.
SECTIONS: dict[str, Callable[[], str]] = {
    "schema": lambda: field_table(Schema),
    "schema.target": lambda: field_table(Target),
    "schema.features": lambda: field_table(Feature),
    "job": lambda: field_table(JobSpec),
    "job.forest": lambda: field_table(ForestParams),
    "job.privacy": privacy_table,
    "job.data": lambda: field_table(DataFacts),
    "job.evaluation": lambda: field_table(EvaluationParams),
    "server": lambda: field_table(ServerSettings),
    "server.tls": lambda: field_table(TLSSettings),
}


def render(text: str) -> str:
    """``text`` with every generated block replaced by its current table.

    Raises
    ------
    ValueError
        A marker names no known section, or a section has no block in ``text``.
    """
    seen: set[str] = set()

    def block(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in SECTIONS:
            raise ValueError(f"unknown generated section {name!r}")
        seen.add(name)
        return m.group(1) + SECTIONS[name]() + m.group(4)

    out = _BLOCK.sub(block, text)
    missing = sorted(set(SECTIONS) - seen)
    if missing:
        raise ValueError(f"no generated block for {missing}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/configuration.md in place (``--check``: exit 1 if it is out of date)."""
    args = sys.argv[1:] if argv is None else argv
    text = DOC_PATH.read_text()
    new = render(text)
    if "--check" in args:
        if new != text:
            print(f"{DOC_PATH} is out of date: run python -m fedforest_cli.config_doc")
            return 1
        return 0
    if new != text:
        DOC_PATH.write_text(new)
        print(f"updated {DOC_PATH}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
