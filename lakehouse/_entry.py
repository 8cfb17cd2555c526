"""The `lakehouse` process's entry: the console script (`[project.scripts]`) and `python -m lakehouse`.

A run that surely needs Spark launches its JVM here, before the command line's own imports (the
metadata model, SQLAlchemy, the control DB: ~0.7 s, then Dagster): lakehouse.spark.start_early
decides from argv and the control DB with sqlite3 alone. It is a module of its own so that the
launch belongs to starting the program, never to importing lakehouse.cli (tests, the Dagster
layer and other programs import it; `python -m lakehouse.cli`, the benches' way in, does the same
launch in cli.py's `__main__` branch). Nothing imports this module but `lakehouse.__main__`.
"""

from __future__ import annotations

import sys


def main() -> int:
    from lakehouse.settings import load_settings
    from lakehouse.spark import start_early

    start_early(sys.argv[1:], load_settings)
    from lakehouse.cli import main as cli_main

    return cli_main()  # as the process's own command line it ends the process (exit_without_teardown)
