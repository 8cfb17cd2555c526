"""lakehouse.runtime.pyarrow_probes: pyarrow's pandas probes answered without importing pandas, and what
stays different in that process if something imports pandas afterwards (why only an Arrow-only
`lakehouse run`'s own process answers them). Each case in a fresh interpreter: the answers last
for the process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_answered_probes_keep_pandas_out_and_what_differs_once_pandas_is_imported_anyway():
    out = _python("""
        import datetime, json, sys
        from lakehouse.runtime import pyarrow_probes
        answered = pyarrow_probes.answer_pandas_probes()
        import numpy as np, pyarrow as pa, pyarrow.compute as pc
        # the Arrow engine's kinds of conversions: Python lists and scalars, numpy arrays, kernels
        pa.array([1, None]); pa.scalar("x"); pa.repeat(pa.scalar("f", pa.string()), 3)
        pa.table({"a": [1.5], "t": [datetime.datetime(2026, 1, 1)]}); pc.equal(pa.array(np.arange(3)), 1)
        out = {"answered": answered, "applied": pyarrow_probes.applied(), "finder_gone":
               not any(type(f).__module__ == "lakehouse.runtime.pyarrow_probes" for f in sys.meta_path),
               "ns_as_py": type(pa.scalar(1000, pa.timestamp("ns")).as_py()).__name__,
               "pandas": "pandas" in sys.modules}

        import pandas as pd  # something imports pandas after all
        ns = pd.Timestamp("2026-01-01 00:00:00.000000001")
        out["categorical"] = str(pa.array(pd.Series(pd.Categorical(["a", "b"]))).type)
        try:
            pa.array([pd.NaT, ns], from_pandas=True)
            out["nat_is_null"] = True
        except ValueError:
            out["nat_is_null"] = False
        out["to_pandas"] = pa.table({"a": [1, 2]}).to_pandas()["a"].tolist()
        out["from_pandas"] = pa.Table.from_pandas(pd.DataFrame({"a": [3]})).column("a").to_pylist()
        out["categorical_after"] = str(pa.array(pd.Series(pd.Categorical(["a", "b"]))).type)
        out["ns_after"] = pa.array([ns], type=pa.timestamp("ns"))[0].value
        out["td_after"] = pa.array([pd.Timedelta(1)], type=pa.duration("ns"))[0].value
        print(json.dumps(out))
    """)
    assert out["answered"] and out["applied"] and out["finder_gone"]
    assert not out["pandas"], "a conversion imported pandas after the probes were answered"
    assert out["ns_as_py"] == "datetime"  # with pandas imported by the probes: pandas' Timestamp
    # once pandas is imported: to_pandas / from_pandas work (the shim retries the import when it
    # needs pandas) and from then on the shim knows a Series again...
    assert out["to_pandas"] == [1, 2] and out["from_pandas"] == [3]
    assert out["categorical_after"] == "dictionary<values=string, indices=int8, ordered=0>"
    # ...but before that a Categorical Series converts as its values, and the C++ side never learns
    # pandas' scalars: NaT is no null, a Timestamp converts as the datetime it is (no nanoseconds)
    assert out["categorical"] == "string"
    assert out["nat_is_null"] is False
    assert out["ns_after"] == 1_767_225_600_000_000_000 and out["td_after"] == 0


def test_nothing_is_answered_when_pandas_is_imported_already():
    out = _python("""
        import json, sys
        import pandas as pd
        from lakehouse.runtime import pyarrow_probes
        answered = pyarrow_probes.answer_pandas_probes()
        import pyarrow as pa
        ns = pd.Timestamp("2026-01-01 00:00:00.000000001")
        print(json.dumps({"answered": answered, "applied": pyarrow_probes.applied(),
                          "categorical": str(pa.array(pd.Series(pd.Categorical(["a"]))).type),
                          "nat": pa.array([pd.NaT, ns], from_pandas=True).null_count,
                          "ns": pa.array([ns], type=pa.timestamp("ns"))[0].value,
                          "td": pa.array([pd.Timedelta(1)], type=pa.duration("ns"))[0].value,
                          "ns_as_py": type(pa.scalar(1000, pa.timestamp("ns")).as_py()).__name__}))
    """)
    assert not out["answered"] and not out["applied"]
    assert out["categorical"].startswith("dictionary<") and out["nat"] == 1
    assert out["ns"] == 1_767_225_600_000_000_001 and out["td"] == 1 and out["ns_as_py"] == "Timestamp"
