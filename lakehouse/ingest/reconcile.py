"""Schema reconciliation of one landing file with its target, in plain Python (no Spark job).

Input: the reference schema (the table's, plus declared columns; for a brand-new table the schema
the run's files agree on), one file's own schema and the schema policy. Output: a `Decision` —
load the file (with the casts, new columns and widenings it needs), quarantine it, or fail the
stage — and the reference as it stands after the file. Columns are matched by name (case-
insensitively, as Spark resolves them), never by position.

| what the file has | evolve | freeze | fail |
|---|---|---|---|
| a column the reference lacks (nested too) | added to the table | file quarantined | stage fails |
| a narrower type (int in a bigint column, float in double, decimal(5,2) in decimal(9,2)) | read and cast | same | same |
| a wider type Iceberg can promote to (int→bigint, float→double, decimal(P,S)→decimal(P',S)) | table column widened | file quarantined | stage fails |
| any other type change (double→string, struct→string, bigint→int) | file quarantined | file quarantined | file quarantined |
| no value for a reference column | NULL | NULL | NULL |
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StructField,
    StructType,
)

LOAD, QUARANTINE, FAIL = "load", "quarantine", "fail"
POLICIES = ("evolve", "freeze", "fail")

_INTEGRAL = {ByteType: 1, ShortType: 2, IntegerType: 3, LongType: 4}
_INTEGRAL_DIGITS = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 19}


@dataclass(frozen=True)
class Change:
    kind: str  # new | missing | cast | widen | unsafe
    path: tuple[str, ...]  # field names; "element" / "value" step into arrays and maps
    expected: DataType | None = None  # the reference's type
    found: DataType | None = None  # the file's type

    @property
    def column(self) -> str:
        return ".".join(self.path)

    def describe(self) -> str:
        e = self.expected.simpleString() if self.expected is not None else None
        f = self.found.simpleString() if self.found is not None else None
        if self.kind == "new":
            return f"new column {self.column} ({f})"
        if self.kind == "missing":
            return f"no column {self.column} (NULL)"
        if self.kind == "cast":
            return f"column {self.column}: {f} read as {e}"
        if self.kind == "widen":
            return f"column {self.column}: found {f}, wider than {e}"
        return f"column {self.column}: expected {e}, found {f}"


@dataclass
class Decision:
    key: str
    action: str = LOAD
    reason: str | None = None
    changes: list[Change] = field(default_factory=list)

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]


# --------------------------------------------------------------------------- comparing types


def primitive_fit(ref: DataType, found: DataType) -> str:
    """same | cast (the file's values read exactly as the reference type) | widen (the reference
    can be promoted to the file's type, as Iceberg allows) | unsafe."""
    if ref == found or isinstance(found, NullType):
        return "same"
    rk, fk = type(ref), type(found)
    if fk in _INTEGRAL:
        if rk in _INTEGRAL:
            return "cast" if _INTEGRAL[fk] < _INTEGRAL[rk] else "widen"
        if rk in (FloatType, DoubleType):
            return "cast"  # integers read as floating point (a JSON amount of 10 in a double column)
        if rk is DecimalType:
            return "cast" if ref.precision - ref.scale >= _INTEGRAL_DIGITS[fk] else "unsafe"
        return "unsafe"
    if fk is FloatType and rk is DoubleType:
        return "cast"
    if fk is DoubleType and rk is FloatType:
        return "widen"
    if fk is DecimalType and rk is DecimalType:
        if ref.scale >= found.scale and ref.precision - ref.scale >= found.precision - found.scale:
            return "cast"
        if ref.scale == found.scale and found.precision > ref.precision:
            return "widen"
    return "unsafe"


def compare(ref: DataType, found: DataType, path: tuple[str, ...] = ()) -> list[Change]:
    """Every difference between the reference type and the file's type, by name, recursively."""
    if isinstance(found, NullType):
        return []
    if isinstance(ref, StructType) and isinstance(found, StructType):
        out: list[Change] = []
        by_name = {f.name.lower(): f for f in ref.fields}
        seen = set()
        for f in found.fields:
            r = by_name.get(f.name.lower())
            if r is None:
                out.append(Change("new", (*path, f.name), None, f.dataType))
            else:
                seen.add(f.name.lower())
                out += compare(r.dataType, f.dataType, (*path, r.name))
        out += [Change("missing", (*path, r.name), r.dataType, None) for r in ref.fields if r.name.lower() not in seen]
        return out
    if isinstance(ref, ArrayType) and isinstance(found, ArrayType):
        return compare(ref.elementType, found.elementType, (*path, "element"))
    if isinstance(ref, MapType) and isinstance(found, MapType):
        if compare(ref.keyType, found.keyType):
            return [Change("unsafe", path, ref, found)]
        return compare(ref.valueType, found.valueType, (*path, "value"))
    if isinstance(ref, (StructType, ArrayType, MapType)) or isinstance(found, (StructType, ArrayType, MapType)):
        return [Change("unsafe", path, ref, found)]
    fit = primitive_fit(ref, found)
    return [] if fit == "same" else [Change(fit, path, ref, found)]


def merge(ref: DataType, found: DataType) -> DataType:
    """The reference with the file's new fields added and its promotable widenings applied
    (only called when `compare` found nothing unsafe)."""
    if isinstance(found, NullType):
        return ref
    if isinstance(ref, StructType) and isinstance(found, StructType):
        by_name = {f.name.lower(): f for f in found.fields}
        fields = [StructField(r.name, merge(r.dataType, by_name[r.name.lower()].dataType) if r.name.lower() in by_name
                              else r.dataType, r.nullable, r.metadata) for r in ref.fields]
        have = {r.name.lower() for r in ref.fields}
        fields += [StructField(f.name, f.dataType, True) for f in found.fields if f.name.lower() not in have]
        return StructType(fields)
    if isinstance(ref, ArrayType) and isinstance(found, ArrayType):
        return ArrayType(merge(ref.elementType, found.elementType), ref.containsNull)
    if isinstance(ref, MapType) and isinstance(found, MapType):
        return MapType(ref.keyType, merge(ref.valueType, found.valueType), ref.valueContainsNull)
    if isinstance(ref, (StructType, ArrayType, MapType)):
        return ref
    return found if primitive_fit(ref, found) == "widen" else ref


def unify(a: DataType, b: DataType) -> DataType | None:
    """One type both can be read as (the wider, with every field of both), or None."""
    if not any(c.kind == "unsafe" for c in compare(a, b)):
        return merge(a, b)
    if not any(c.kind == "unsafe" for c in compare(b, a)):
        return merge(b, a)
    return None


# --------------------------------------------------------------------------- decisions


def _reason(changes: list[Change], policy: str) -> str:
    return "; ".join(c.describe() for c in changes) + (f" (schema policy {policy})" if policy else "")


def reconcile(reference: StructType, schema: StructType, policy: str, key: str,
              allowed_new: Iterable[str] = ()) -> tuple[Decision, StructType]:
    """Decide what to do with one file; returns the decision and the reference after it.

    `allowed_new`: lower-cased top-level names that may join the table under every policy
    (declared columns and schema-contract columns the table does not have yet)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown schema policy {policy!r}; one of {', '.join(POLICIES)}")
    allowed = {n.lower() for n in allowed_new}
    changes = compare(reference, schema)
    decision = Decision(key, LOAD, None, changes)
    unsafe = decision.of("unsafe")
    if unsafe:
        decision.action, decision.reason = QUARANTINE, "unsafe type change: " + _reason(unsafe, "")
        return decision, reference
    drift = [c for c in changes if c.kind == "widen" or (c.kind == "new" and not (len(c.path) == 1
                                                                                  and c.path[0].lower() in allowed))]
    if drift and policy != "evolve":
        decision.action = QUARANTINE if policy == "freeze" else FAIL
        decision.reason = _reason(drift, policy)
        return decision, reference
    if any(c.kind in ("new", "widen") for c in changes):
        reference = merge(reference, schema)
    return decision, reference


def reconcile_files(reference: StructType, files: list[tuple[str, StructType]], policy: str,
                    allowed_new: Iterable[str] = ()) -> tuple[list[Decision], StructType]:
    """Reconcile files in order; each loaded file's additions are the next file's reference."""
    allowed = list(allowed_new)
    out = []
    for key, schema in files:
        d, reference = reconcile(reference, schema, policy, key, allowed)
        out.append(d)
    return out, reference


def vote(schemas: list[StructType]) -> StructType:
    """The schema of a new table: per column (by name, in order of first appearance), the type most
    files can be read as, so that one drifted file cannot decide the table's types."""
    order: dict[str, str] = {}
    seen: dict[str, list[DataType]] = {}
    for s in schemas:
        for f in s.fields:
            order.setdefault(f.name.lower(), f.name)
            seen.setdefault(f.name.lower(), []).append(f.dataType)
    fields = []
    for low, name in order.items():
        groups: list[list] = []  # [unified type, files]
        for t in seen[low]:
            for g in groups:
                u = unify(g[0], t)
                if u is not None:
                    g[0], g[1] = u, g[1] + 1
                    break
            else:
                groups.append([t, 1])
        best = max(groups, key=lambda g: g[1])  # max keeps the first of equals: the earliest files win ties
        fields.append(StructField(name, best[0], True))
    return StructType(fields)
