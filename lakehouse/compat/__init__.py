"""Shims over dependencies that have no public API for what the platform needs: one module per
dependency, each naming the versions it was written for (`WRITTEN_FOR`, a PEP 440 specifier set),
each checked by a test that fails on an installed version outside them. Nothing else in production
code may use a dependency's private names (tests/test_no_private_api.py)."""
