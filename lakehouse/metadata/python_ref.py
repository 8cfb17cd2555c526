"""The reference of a Python transformation stage (`package.module:function`), checked before any run.

Static, like the SQL checks: importing the module runs its top level (as any plugin import does),
but the function itself is not called; its output columns are known only once it has run.

Where a transformation module is found: next to the metadata. `search_in` puts a directory on the
import path (`sys.path`) of this process, once; the platform does it for the metadata directory
(`LAKEHOUSE_METADATA_DIR`) in every process that has a `Platform` (the CLI, `dagster dev`'s code
server, run workers, `lakehouse serve`), and `lakehouse metadata validate|apply PATH` also for
PATH's directory. A module that is not found gets a Fix hint naming where it was looked for.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

#: the metadata directories put on the import path, in order (for the hint of a missing module)
SEARCHED: list[str] = []


def search_in(*directories: str | Path | None) -> None:
    """Put each existing directory on this process's import path (at its end, once): a
    transformation module next to the metadata imports by its name."""
    for d in directories:
        if d is None:
            continue
        path = str(Path(d).expanduser().resolve())
        if path not in SEARCHED:
            SEARCHED.append(path)
        if Path(path).is_dir() and path not in sys.path:
            sys.path.append(path)


def _missing_module_hint(module_name: str, missing: str) -> str:
    where = ", ".join(SEARCHED) or "no metadata directory (LAKEHOUSE_METADATA_DIR is not set)"
    file = missing.replace(".", "/")
    return (f"module {module_name!r} does not import: ModuleNotFoundError: No module named {missing!r}; looked "
            f"in the metadata director(ies) {where} and the Python path. Fix: put {file}.py (or a package "
            f"{file}/) in the metadata directory (LAKEHOUSE_METADATA_DIR), or install it into the platform's "
            "environment")


def reference_problem(ref: str) -> str | None:
    """Why `package.module:function` cannot be a stage's transformation (None: it can): the module
    imports, the name is a callable, and it takes the mapping of inputs as its one argument."""
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):  # not one it imports
            return _missing_module_hint(module_name, exc.name)
        return f"module {module_name!r} does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    except Exception as exc:  # noqa: BLE001 - any import failure is the metadata's problem, reported
        return f"module {module_name!r} does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    fn = getattr(module, name, None)
    if fn is None:
        return f"module {module_name!r} has no {name!r}"
    if not callable(fn):
        return f"{ref} is a {type(fn).__name__}, not a function"
    try:
        inspect.signature(fn).bind({})
    except TypeError as exc:
        return f"{ref} must take one argument (the mapping of input tables to DataFrames): {exc}"
    except ValueError:
        pass  # no signature to inspect (a builtin): it is called and judged at run time
    return None
