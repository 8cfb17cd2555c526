"""The JSON-lines probe's vectorised value checks (`_arrow_fits`, `_FAST_TEXT`) against the Python
predicate they stand for (`_fitter`), on tricky values, so the two cannot drift: every text the RE2
pattern accepts the predicate accepts, and a column's verdict is the predicate's over its values
(fast lane: no Spark)."""

from __future__ import annotations

import itertools
import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    TimestampNTZType,
    TimestampType,
)

from lakehouse.ingest.probe import _FAST_TEXT, _arrow_fits, _fitter, _probe_jsonl, _probe_jsonl_arrow
from lakehouse.metadata.model import FileLimits

DATETIMES = [TimestampType(), TimestampNTZType(), DateType()]
NUMBERS = [LongType(), IntegerType(), ShortType(), ByteType(), DoubleType(), FloatType(), BooleanType()]

EDGE_TEXTS = [
    "2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29", "2024-02-29 23:59:59", "2023-02-29T00:00:00",
    "2024-01-01T00:00:00Z", "2024-01-01T00:00:00+18:00", "2024-01-01T00:00:00-18:00", "2024-01-01T00:00:00+18:01",
    "2024-01-01T00:00:00+19:00", "2024-01-01T00:00:00+1:00", "2024-01-01T00:00:00+0100", "2024-01-01T00:00:00 UTC",
    "2024-01-01T00:00:00GMT", "2024-01-01 00:00:00 GMT+01:00", "2024-01-01T00:00:00Europe/Paris",
    "2024-01-01T00:00:00z", "2024-01-01T00:00Z", "2024-01-01T10Z", "2024-01-01Z", "2024-01-01T", "2024-01-01 ",
    " 2024-01-01", "2024-1-1", "2024-01-1", "20240101", "0000-01-01", "9999-12-31 23:59:59.999999",
    "+2024-01-01", "-2024-01-01", "12024-01-01", "294247-01-10 04:00:54.775807", "294247-01-10 04:00:54.775808",
    "2024-01-01T00:00:00.1234567", "2024-01-01T00:00:00.", "2024-01-01 24:00:00", "2024-01-01 23:60:00",
    "2024-01-01 23:59:60", "2024-13-01", "2024-00-10", "2024-04-31", "2024-06-30", "2024-12-31",
    "10:30:00", "T10:30", "2024-01-01T10:30:00.5+05:30", "2024-01-01\t10:00", "2024-01-01\n", "2024-01-01x",
    "２０２４-01-01", "٢٠٢٤-٠١-٠١", "2024-01-01T10:30:00Ｚ", "", "null", "12", "-1", "1700000000", "2147483648",
    "2024-01-01 10:30:00.000000+00:00", "2024-03-31T01:30:00+01:00", "1970-01-01T00:00:00-00:00",
]
EDGE_INTS = [0, 1, -1, 127, 128, -128, -129, 32767, 32768, -32768, -32769, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
             2**63 - 1, -2**63, 1700000000]
EDGE_FLOATS = [0.0, -0.0, 1.5, 1e300, -1e-300, float("nan"), float("inf"), 2.0**63]


def _texts(seed: int = 3, n: int = 4000) -> list[str]:
    """Timestamp-like texts built from right and wrong parts, truncated and padded at random."""
    rng = random.Random(seed)
    parts = {
        "year": ["2024", "2023", "2000", "1900", "0000", "0001", "9999", "1970", "12345", "999", "+2024", "-0044"],
        "month": ["01", "02", "04", "09", "11", "12", "00", "13", "1", "2"],
        "day": ["01", "09", "28", "29", "30", "31", "32", "00", "1"],
        "sep": ["T", " ", "t", "  ", "_"],
        "hour": ["00", "09", "19", "23", "24", "1"],
        "minute": ["00", "59", "60", "5"],
        "second": ["00", "59", "60", "7"],
        "fraction": ["", "", ".1", ".123456", ".1234567", ".", ".12a"],
        "zone": ["", "", "Z", "+01:00", "-05:30", "+18:00", "-18:00", "+18:01", "+19:00", "+1:00", "+0130",
                 "+01:00:00", "UTC", " UTC", "GMT", "Z ", "z", "+25:00", "-00:60", "Europe/Paris", "Mars/Base"],
    }
    out = list(EDGE_TEXTS)
    for _ in range(n):
        p = {k: rng.choice(v) for k, v in parts.items()}
        text = (f"{p['year']}-{p['month']}-{p['day']}{p['sep']}{p['hour']}:{p['minute']}:{p['second']}"
                f"{p['fraction']}{p['zone']}")
        cut = rng.random()
        if cut < 0.15:
            text = text[:10]
        elif cut < 0.3:
            text = text[:rng.randint(1, len(text))]
        if rng.random() < 0.05:
            text = rng.choice([" ", "\t", "\u00a0"]) + text
        out.append(text)
    return out


@pytest.mark.parametrize("dtype", DATETIMES, ids=lambda t: t.typeName())
def test_every_text_the_pattern_accepts_the_predicate_accepts(dtype):
    texts = _texts()
    matched = pc.match_substring_regex(pa.array(texts), _FAST_TEXT[dtype.typeName()]).to_pylist()
    fit = _fitter(dtype)
    wrong = [t for t, m in zip(texts, matched, strict=True) if m and not fit(t)]
    assert not wrong, wrong[:10]
    assert sum(matched) > 100
    # the usual spellings are decided by the pattern itself (else the predicate does the work again)
    usual = ["2024-01-31", "2024-06-30 10:00", "2024-01-01 10:00:00", "2024-01-01T10:00:00.123456", "2024-02-28T23"]
    if dtype.typeName() != "timestamp_ntz":
        usual += ["2024-01-01T10:00:00Z", "2024-01-01T10:00:00.123+01:00", "2024-01-01 10:00:00-05:30"]
    assert all(pc.match_substring_regex(pa.array(usual), _FAST_TEXT[dtype.typeName()]).to_pylist()), usual


@pytest.mark.parametrize("dtype", DATETIMES + NUMBERS, ids=lambda t: t.typeName())
def test_a_columns_verdict_is_the_predicates_over_its_values(dtype):
    fit = _fitter(dtype)
    rng = random.Random(dtype.typeName())
    texts = _texts(seed=11, n=600)
    columns = [(pa.string(), texts), (pa.int64(), EDGE_INTS), (pa.float64(), EDGE_FLOATS), (pa.bool_(), [True, False])]
    for arrow_type, values in columns:
        for v in values:  # one value at a time, with a null beside it
            got = _arrow_fits(pa.array([v, None], arrow_type), dtype)
            assert got == fit(v), (dtype, v)
        for _ in range(60):  # and mixes: one unreadable value fails the column
            sample = rng.sample(values, min(len(values), rng.randint(1, 6)))
            assert _arrow_fits(pa.array(sample + [None], arrow_type), dtype) == all(fit(v) for v in sample), sample


def test_checked_dates_and_timestamps_are_read_once_and_agree_with_the_python_probe(tmp_path, monkeypatch):
    """The checked date/timestamp columns are parsed as text in the one read (pyarrow would take
    them for timestamps), in the file's column order, with the Python probe's verdict and schema."""
    import pyarrow.json as pjson

    reads = []
    real = pjson.read_json
    monkeypatch.setattr(pjson, "read_json", lambda *a, **k: reads.append(k) or real(*a, **k))
    texts = [t for t in _texts(seed=5, n=300)]
    expects = [{"ts": TimestampType()}, {"ts": TimestampNTZType(), "n": LongType()}, {"ts": DateType()},
               {"ts": TimestampType(), "d": DateType()}]
    answered = 0
    for n, (text, expect) in enumerate(itertools.product(texts[:150], expects)):
        rows = [{"n": 1, "ts": "2024-05-01 10:00:00", "d": "2024-02-29"}, {"ts": text, "n": 2**40, "d": None},
                {"n": 3, "extra": True, "ts": None, "d": "2024-01-01T00:00:00Z"}]


        path = tmp_path / f"f{n}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        reads.clear()
        fast = _probe_jsonl_arrow(path, FileLimits(), expect)
        with open(path, "rb") as fh:
            slow = _probe_jsonl(fh, FileLimits(), expect)
        if fast is None:
            assert slow.status != "processed" or any(_fitter(t)(text) is False for k, t in expect.items()
                                                     if k == "ts") or not text, (text, expect)
            continue
        answered += 1
        assert len(reads) == 1, (text, expect)
        assert (fast.status, fast.schema.simpleString(), fast.rows) == (slow.status, slow.schema.simpleString(),
                                                                         slow.rows), (text, expect)
    assert answered > 150
