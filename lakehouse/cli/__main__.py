"""`python -m lakehouse.cli` (the benches' way in) is `python -m lakehouse`, the console script's
entry (lakehouse._entry: what it decides before the parser's imports, e.g. a run's early JVM)."""

import runpy

runpy.run_module("lakehouse", run_name="__main__", alter_sys=False)  # ends the process
