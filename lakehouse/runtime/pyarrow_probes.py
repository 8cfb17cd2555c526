"""pyarrow's "is pandas there?" probes, answered without importing pandas, for an Arrow-only run.

pyarrow imports pandas on its first conversion of a Python object (`pa.array([...])`,
`pa.scalar(v)`, even `pa.array(np.arange(3))` or `pc.equal`) only to ask whether the object is a
pandas one: its Cython shim (pandas-shim.pxi) tries `import pandas`
once, and the C++ side's `InitPandasStaticData` imports it once too (apache/arrow#34994). In a
1k-row Arrow `lakehouse run` that is 302 modules and ~0.15-0.18 s of the process's ~2.3 s of CPU
(issue 21), for a process that never hands pandas objects to pyarrow.

`answer_pandas_probes` runs both probes once with `import pandas` refused, then allows it again.
Each probe keeps its answer, no pandas, and does not ask again. While pandas is not imported no
object can be a pandas object, so the answers are right. One more answer follows from them: a
nanosecond timestamp's or duration's `as_py()` is a datetime / timedelta (an error if that would
drop nanoseconds), not a pandas Timestamp / Timedelta; the platform reads no nanosecond timestamps
(lakehouse.engines.types.arrow_to_spark refuses them, as Spark does). If something DOES import
pandas later in the process (tests/test_pyarrow_probes.py):

- `Table.to_pandas()` and `Table.from_pandas(df)` still work: the shim retries the import on a
  call that needs pandas, and once it has, its checks see pandas again;
- before such a call, `pa.array(series)` does not know a Series: a Categorical one converts as
  its values (strings), not as a dictionary array;
- for the rest of the process the C++ side knows none of pandas' scalars: `pd.NaT` is no null,
  a `pd.Timestamp` / `pd.Timedelta` converts as the datetime / timedelta it subclasses (its
  nanoseconds are dropped).

So it is for a process that surely never mixes pandas and pyarrow: `lakehouse run`'s own process
when `lakehouse.engines.choice.may_need_spark` says no (every stage is one the Arrow engine writes: no
SQL stage, whose DuckDB side converts through pandas, no Python stage, no other source). An
`auto` stage whose input turns out too big is written by Spark after all, whose driver in this
platform hands pyarrow no pandas objects either (lakehouse.sources.duckdb_sql is the only place
that converts between the two, and it belongs to SQL stages). Never in a process that may use
pandas with pyarrow later: a test session running commands in-process, the code server, a
long-lived run worker.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec

_state = {"applied": False}


class _RefusePandas:
    """A meta_path finder for which pandas is not installed, as pyarrow's probes see it."""

    def find_spec(self, name: str, path=None, target=None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (lakehouse.runtime.pyarrow_probes)", name=name)
        return None


def answer_pandas_probes() -> bool:
    """Run pyarrow's two pandas probes with pandas refused (see the module docstring for when it is
    safe). Does nothing, returning False, when pandas is already imported: the probes would find it
    (and with pandas installed, it is imported once pyarrow has converted anything)."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa  # outside the window: pandas is refused to the probes only

    finder = _RefusePandas()
    sys.meta_path.insert(0, finder)
    try:
        # the first Python-object conversion runs both probes: the Cython shim's (is it a Series?)
        # and the C++ side's (InitPandasStaticData); public API only (tests/test_pyarrow_probes.py)
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
    _state["applied"] = True
    return True


def applied() -> bool:
    """Whether this process answered pyarrow's pandas probes without pandas."""
    return _state["applied"]
