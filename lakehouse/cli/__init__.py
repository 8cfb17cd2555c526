"""The `lakehouse` command line: the parser and its core commands (`app`), one module per further
command group (`alerts`, `backfill`, `control`, ...; each registers in `app.EXTRA_COMMANDS`), the
demo data (`demo`). Packages above the domain add commands through the `lakehouse.cli` entry-point
group (the Dagster layer adds `lakehouse run`).

This module stays light: `python -m lakehouse.cli` (the benches' way in) runs `__main__`, which is
`python -m lakehouse` (lakehouse._entry decides a run's early JVM from argv before the parser's
imports), and importing the package must not import the parser first. `from lakehouse.cli import
main` (and EXTRA_COMMANDS, json) still works: the names are taken from `app` on first use.
"""

from __future__ import annotations

__all__ = ["main", "EXTRA_COMMANDS", "json"]


def __getattr__(name: str):
    if name in __all__:
        from lakehouse.cli import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
