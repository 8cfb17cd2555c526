"""Roots are walls: no symlink, `..` step or absolute path takes a source's input outside its root.

A local landing directory is walked without following symlinks out of it; an object key with a
`.`/`..` segment or a leading `/` is refused (Hadoop paths normalise `..`, so `s3a://b/logs/../x`
would read outside the prefix, and a local copy named after the key would land outside its folder).
Refused input is reported with the reason, never read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath


class PathEscape(ValueError):
    """Input that would leave its root."""


def _within(root_real: str, path_real: str) -> bool:
    return path_real == root_real or path_real.startswith(root_real.rstrip(os.sep) + os.sep)


def confine(root: Path, relative: str, what: str = "path") -> Path:
    """`root / relative`, refusing an absolute path, a `..` step, or a symlink that leads outside."""
    rel = PurePosixPath(relative.replace("\\", "/"))
    if not relative or rel.is_absolute() or Path(relative).is_absolute() or ".." in rel.parts:
        raise PathEscape(f"{what} {relative!r} is refused: it is absolute or has a '..' step, "
                         f"so it would leave {root}")
    path = Path(root) / Path(*rel.parts)
    real = os.path.realpath(path)
    if not _within(os.path.realpath(root), real):
        raise PathEscape(f"{what} {relative!r} is refused: it resolves to {real}, outside {root}")
    return path


def key_problem(key: str, prefix: str = "") -> str | None:
    """Why an object key cannot be read as a file of a source under `prefix` (None if it can)."""
    if "\x00" in key:
        return f"refused: object key {key!r} contains a NUL byte"
    if key.startswith("/"):
        return f"refused: object key {key!r} starts with '/' (an absolute path)"
    if any(part in (".", "..") for part in key.split("/")):
        return f"refused: object key {key!r} has a '.' or '..' segment, which would leave the prefix {prefix!r}"
    if prefix and not key.startswith(prefix):
        return f"refused: object key {key!r} is not under the source's prefix {prefix!r}"
    return None


def walk_files(root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """(key relative to root, path, refusal) for every regular file under `root`, in key order.

    A symlink is followed only when its target is a regular file inside the root; one leading
    outside is yielded with the reason it is refused. Symlinked directories are never entered
    (one inside the root would list its files twice, one outside is refused). FIFOs, sockets and
    devices are skipped: reading them could block forever.
    """
    root_real = os.path.realpath(root)
    found: list[tuple[str, Path, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                dirnames.remove(d)
                target = os.path.realpath(full)
                if not _within(root_real, target):
                    found.append((_rel(root, full), Path(full),
                                  f"refused: symlinked directory -> {target} leaves the source root {root}"))
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not _within(root_real, target):
                    found.append((_rel(root, full), Path(full),
                                  f"refused: symlink -> {target} leaves the source root {root}"))
                    continue
                if not os.path.isfile(target):
                    continue  # dangling, or not a regular file
            elif not os.path.isfile(full):
                continue
            found.append((_rel(root, full), Path(full), None))
    yield from sorted(found, key=lambda x: x[0])


def _rel(root: Path, full: str) -> str:
    return Path(os.path.relpath(full, root)).as_posix()
