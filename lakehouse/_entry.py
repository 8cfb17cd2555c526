"""The `lakehouse` process's entry: the console script (`[project.scripts]`), `python -m lakehouse`
and `python -m lakehouse.cli` (the benches' way in, which runs this package's `__main__`).

What a command line decides before its own imports is decided here, from argv alone
(lakehouse.runtime.startup): a `lakehouse run` pauses the cyclic garbage collector until its job starts,
and a run that surely needs Spark launches its JVM here, before the command line's imports (the
metadata model, SQLAlchemy, the control DB: ~0.7 s, then Dagster): lakehouse.runtime.spark.start_early
decides from argv and the control DB with sqlite3 alone. It is a module of its own so that both
belong to starting the program, never to importing lakehouse.cli (tests, the Dagster layer and
other programs import it). Nothing imports this module but `lakehouse.__main__`.
"""

from __future__ import annotations

import sys


def main() -> int:
    from lakehouse.runtime.startup import pause_collector_for_run, resume_collector

    try:
        pause_collector_for_run(sys.argv[1:])  # first: the imports below are the start-up it is paused for
        from lakehouse.runtime.spark import start_early
        from lakehouse.settings import load_settings

        start_early(sys.argv[1:], load_settings)
        from lakehouse.cli import main as cli_main

        return cli_main()  # as the process's own command line it ends the process (exit_without_teardown)
    finally:  # a command line refused (SystemExit), or a caller that goes on (a test): collect as before
        resume_collector()
