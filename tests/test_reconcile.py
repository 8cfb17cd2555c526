"""Schema reconciliation of one file with its table, in plain Python (fast lane: no Spark job)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lakehouse.ingest.reconcile import FAIL, LOAD, QUARANTINE, compare, primitive_fit, reconcile, reconcile_files, vote


def S(**cols) -> StructType:
    return StructType([StructField(k, v) for k, v in cols.items()])


TABLE = S(id=StringType(), amount=DoubleType(), qty=LongType(), extra=S(channel=StringType()))


@pytest.mark.parametrize(("ref", "found", "fit"), [
    (LongType(), IntegerType(), "cast"),
    (IntegerType(), LongType(), "widen"),
    (DoubleType(), FloatType(), "cast"),
    (FloatType(), DoubleType(), "widen"),
    (DoubleType(), LongType(), "cast"),  # a JSON amount of 10 in a double column
    (LongType(), DoubleType(), "unsafe"),
    (DecimalType(12, 2), DecimalType(9, 2), "cast"),
    (DecimalType(9, 2), DecimalType(12, 2), "widen"),
    (DecimalType(9, 2), DecimalType(9, 3), "unsafe"),  # scale changes are not promotions
    (DecimalType(12, 2), IntegerType(), "cast"),
    (DecimalType(5, 2), LongType(), "unsafe"),
    (DoubleType(), StringType(), "unsafe"),
    (StringType(), LongType(), "unsafe"),
    (TimestampType(), TimestampNTZType(), "unsafe"),
    (StringType(), StringType(), "same"),
])
def test_primitive_fit(ref, found, fit):
    assert primitive_fit(ref, found) == fit


def test_unsafe_change_quarantines_under_every_policy_naming_column_expected_and_found():
    drifted = S(id=StringType(), amount=StringType())
    for policy in ("evolve", "freeze", "fail"):
        d, after = reconcile(TABLE, drifted, policy, "drift.parquet")
        assert d.action == QUARANTINE
        assert d.reason == "unsafe type change: column amount: expected double, found string"
        assert after == TABLE  # the reference is untouched by a file that is not loaded


def test_columns_match_by_name_case_insensitively_never_by_position():
    reordered = S(QTY=LongType(), Extra=S(Channel=StringType()), ID=StringType(), Amount=DoubleType())
    d, after = reconcile(TABLE, reordered, "freeze", "f")
    assert d.action == LOAD and d.changes == [] and after == TABLE


def test_evolve_adds_new_and_nested_columns_and_widens():
    f = S(id=StringType(), qty=IntegerType(), coupon_code=StringType(),
          extra=S(channel=StringType(), score=FloatType()), points=ArrayType(S(x=LongType())))
    d, after = reconcile(TABLE, f, "evolve", "f")
    assert d.action == LOAD
    assert sorted(c.describe() for c in d.changes) == [
        "column qty: int read as bigint", "new column coupon_code (string)", "new column extra.score (float)",
        "new column points (array<struct<x:bigint>>)", "no column amount (NULL)"]
    assert after.simpleString() == ("struct<id:string,amount:double,qty:bigint,extra:struct<channel:string,score:float>,"
                                    "coupon_code:string,points:array<struct<x:bigint>>>")
    d, after = reconcile(S(q=IntegerType()), S(q=LongType()), "evolve", "g")
    assert [c.kind for c in d.changes] == ["widen"] and after == S(q=LongType())


def test_freeze_quarantines_files_with_new_columns_and_fail_fails():
    f = S(id=StringType(), coupon_code=StringType())
    d, after = reconcile(TABLE, f, "freeze", "f")
    assert (d.action, d.reason) == (QUARANTINE, "new column coupon_code (string) (schema policy freeze)")
    assert after == TABLE
    d, _ = reconcile(TABLE, f, "fail", "f")
    assert (d.action, d.reason) == (FAIL, "new column coupon_code (string) (schema policy fail)")
    d, _ = reconcile(S(q=IntegerType()), S(q=LongType()), "freeze", "g")
    assert d.action == QUARANTINE and "found bigint, wider than int" in d.reason
    # a declared / contract column the table lacks yet is not drift under any policy
    d, after = reconcile(TABLE, f, "freeze", "f", allowed_new=["COUPON_CODE"])
    assert d.action == LOAD and "coupon_code" in after.fieldNames()


def test_missing_columns_are_nulls_and_nested_conflicts_are_unsafe():
    d, _ = reconcile(TABLE, S(id=StringType()), "freeze", "f")
    assert d.action == LOAD and {c.column for c in d.of("missing")} == {"amount", "qty", "extra"}
    d, _ = reconcile(TABLE, S(extra=StringType()), "evolve", "f")
    assert d.action == QUARANTINE and "column extra: expected struct<channel:string>, found string" in d.reason
    d, _ = reconcile(S(m=MapType(StringType(), LongType())), S(m=MapType(LongType(), LongType())), "evolve", "f")
    assert d.action == QUARANTINE


def test_files_in_order_each_loaded_file_extends_the_next_ones_reference():
    decisions, after = reconcile_files(S(id=StringType()), [
        ("a", S(id=StringType(), x=LongType())),
        ("b", S(id=StringType(), x=StringType())),  # conflicts with what a added
        ("c", S(id=StringType(), x=IntegerType(), y=DoubleType())),
    ], "evolve")
    assert [d.action for d in decisions] == [LOAD, QUARANTINE, LOAD]
    assert after == S(id=StringType(), x=LongType(), y=DoubleType())


def test_vote_one_drifted_file_cannot_decide_a_new_tables_types():
    drift_first = [S(amount=StringType()), S(amount=DoubleType(), q=IntegerType()), S(amount=DoubleType()),
                   S(amount=FloatType(), q=LongType(), extra=S(a=LongType())), S(extra=S(b=StringType()))]
    assert vote(drift_first).simpleString() == "struct<amount:double,q:bigint,extra:struct<a:bigint,b:string>>"
    assert vote([S(a=StringType()), S(a=LongType())]) == S(a=StringType())  # a tie: the first file wins


def test_compare_paths_step_into_arrays_and_maps():
    ref = S(a=ArrayType(S(x=LongType())), m=MapType(StringType(), S(v=LongType())))
    found = S(a=ArrayType(S(x=LongType(), y=StringType())), m=MapType(StringType(), S(v=IntegerType())))
    assert {(c.kind, c.column) for c in compare(ref, found)} == {("new", "a.element.y"), ("cast", "m.value.v")}


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="unknown schema policy 'strict'"):
        reconcile(TABLE, TABLE, "strict", "f")
