"""Shims for what a dependency has no public way to do: one module per dependency, each bound to the
versions it was written for (tests/test_compat_*.py fail on another)."""
