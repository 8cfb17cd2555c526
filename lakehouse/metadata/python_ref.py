"""The reference of a Python transformation stage (`package.module:function`), checked before any run.

Static, like the SQL checks: importing the module runs its top level (as any plugin import does),
but the function itself is not called; its output columns are known only once it has run.
"""

from __future__ import annotations

import importlib
import inspect


def reference_problem(ref: str) -> str | None:
    """Why `package.module:function` cannot be a stage's transformation (None: it can): the module
    imports, the name is a callable, and it takes the mapping of inputs as its one argument."""
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
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
