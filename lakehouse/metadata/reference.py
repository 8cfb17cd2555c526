"""Markdown reference of every metadata table and field, generated from the pydantic model.

docs/metadata-reference.md is this function's output; a test keeps the two in sync.
"""

from __future__ import annotations

import typing
from typing import Any, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from lakehouse.metadata.model import (
    SECTIONS,
    ColumnSpec,
    Incremental,
    Maintenance,
    PartitionField,
    PromoteField,
    Rule,
    SortField,
    TimePartition,
)


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", "") for a in get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in get_args(annotation) if a is not type(None))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(f: FieldInfo) -> str:
    if f.default is PydanticUndefined and f.default_factory is None:
        return "**required**"
    if f.default_factory is not None:
        value = f.default_factory()
        return "`" + repr(value) + "`" if value else "empty"
    return "`" + repr(f.default) + "`"


def _table(model) -> list[str]:
    key = getattr(model, "__key__", ())
    lines = ["| field | type | default | notes |", "|---|---|---|---|"]
    for name, f in model.model_fields.items():
        notes = (f.description or "").replace("|", "\\|")
        if name in key:
            notes = ("primary key. " + notes).strip()
        lines.append(f"| `{name}` | {_type_name(f.annotation)} | {_default(f)} | {notes} |")
    return lines


def render() -> str:
    out = [
        "# Metadata reference",
        "",
        "Generated from `lakehouse/metadata/model.py` by `lakehouse metadata reference`; do not edit by hand.",
        "Each section is a top-level key of a metadata YAML file and a table in the control database.",
        "",
    ]
    for section, model in SECTIONS.items():
        doc = (model.__doc__ or "").strip().splitlines()
        out += [f"## `{section}`", ""]
        if doc and not doc[0].startswith("Base of every"):
            out += [doc[0], ""]
        out += _table(model) + [""]
    for title, model in (("rule (inside validation_rules.rules)", Rule), ("column spec", ColumnSpec),
                         ("partition field", PartitionField), ("sort field", SortField),
                         ("promote field", PromoteField),
                         ("maintenance (targets.maintenance; platform defaults: settings maintenance.<field>)",
                          Maintenance),
                         ("incremental (stages.incremental; lakehouse.stage.incremental)", Incremental),
                         ("time partition (targets.time_partition; time partitions and backfills)", TimePartition)):
        out += [f"## {title}", ""] + _table(model) + [""]
    return "\n".join(out)
