"""A file that cannot be read is that file's problem: when a batch of files fails to read (a corrupt
data page behind an intact footer, a codec the engine lacks, a file deleted or rewritten under
the run), find the failing files, set them aside, and write the rest of the batch.

One implementation for both engines. An engine hands over the batch's files and a
`lakehouse.stage.core.FileReader` (how it reads some of them: `frame` and `check`); this module

1. leaves for the next run every file that vanished or changed since the plan (nothing recorded
   for it, so the next run plans what is there then; audit event `file_deferred`);
2. bisects the rest with the engine's `check` (read to the last value, nothing written): a group
   that reads is good, a single file that fails is the culprit. k bad files among n cost about
   2·k·log2(n) reads, one file alone costs one;
3. quarantines each culprit with its own error as the reason (the source adapter's
   `quarantine_files`: the ingestion checkpoint, a copy under <home>/quarantine/files, audit event
   `file_quarantined`, the run's `files_quarantined`), and
4. rebuilds the batch over the good files (its checkpoint property says what became of the others).

The Arrow engine reads eagerly, so it calls `read_isolating` where it reads a batch; Spark reads
lazily, so its read fails inside the branch write, and the write-audit-publish service calls
`write_isolating` around the engine's write. Nothing is written by a failed write (one Iceberg
commit per batch), so the rebuilt batch is written on the same branch and no branch is left over.
An error that no file of the batch reproduces on its own is raised as it was (healing and the
step's retries take it from there).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from lakehouse.errors import CORRUPT_INPUT, UNKNOWN, classify
from lakehouse.ingest.files import CHECKPOINT_PROPERTY, QUARANTINED, gone_or_changed, note_deferred_files

if TYPE_CHECKING:
    from lakehouse.stage.core import Batch, FileReader, FileRef, StageContext

T = TypeVar("T")

#: error codes a batch read can fail with because of one of its files: CORRUPT_INPUT, and what the
#: platform cannot classify (a reader's own message); never a commit conflict, memory, a dead
#: session, a timeout, a decision or a configuration error, which no file explains
PER_FILE_CODES = frozenset({CORRUPT_INPUT, UNKNOWN})
#: the longest reason kept for a quarantined file
MAX_REASON = 500


def per_file(exc: BaseException) -> bool:
    """May this error of a batch read be one file's fault (so that finding the file is worth a read)?"""
    return classify(exc).code in PER_FILE_CODES


def reason_of(exc: BaseException) -> str:
    """One line saying why a file cannot be read: the innermost Java cause when the JVM read it
    (`Caused by: ...: don't know what type: 15`), else the reader's own message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    if not lines:
        return type(exc).__name__
    causes = [ln for ln in lines if ln.startswith("Caused by: ")]
    if causes:
        text = causes[-1].removeprefix("Caused by: ")
    elif len(lines) > 1 and ("Job aborted" in lines[0] or "error occurred while calling" in lines[0]):
        text = next((ln for ln in lines[1:] if "Exception: " in ln or "Error: " in ln), lines[1])
    else:
        text = " ".join(lines)
    if ": " in text and re.match(r"^(?:[\w$]+\.)+[\w$]+(?:Exception|Error): ", text):
        short, _, rest = text.partition(": ")
        text = f"{short.rsplit('.', 1)[-1]}: {rest}"
    return f"unreadable ({type(exc).__name__ if not causes else 'read failed'}): {text}"[:MAX_REASON]


def find_unreadable(files: list[FileRef], check: Callable[[list[FileRef]], None],
                    known_to_fail: bool = True) -> dict[str, BaseException]:
    """key -> error of every file of `files` that `check` fails on, by bisection (`known_to_fail`:
    the whole group failed already, so it is split at once)."""
    out: dict[str, BaseException] = {}

    def visit(group: list[FileRef], failed: bool) -> None:
        if not failed:
            try:
                check(group)
                return
            except Exception as exc:  # noqa: BLE001 - any failure: look closer
                if len(group) == 1:
                    out[group[0].key] = exc
                    return
        if len(group) == 1:  # known to fail alone: read it once for its own error
            visit(group, False)
            return
        mid = len(group) // 2
        visit(group[:mid], False)
        visit(group[mid:], False)

    if files:
        visit(files, known_to_fail)
    return out


@dataclass
class Isolated:
    """What finding the failing files of a batch decided."""

    good: list[FileRef]
    quarantined: list[FileRef] = field(default_factory=list)  # with status quarantined and the reason
    deferred: dict[str, str] = field(default_factory=dict)  # key -> why it is left for the next run

    @property
    def found(self) -> bool:
        return bool(self.quarantined or self.deferred)


def isolate(ctx: StageContext, files: list[FileRef], reader: FileReader, error: BaseException) -> Isolated:
    """The files of a batch that failed with `error`, sorted into good, quarantined and deferred
    (recorded as the module docstring says). Raises `error` when no file explains it."""
    deferred = {f.key: why for f in files if (why := gone_or_changed(f)) is not None}
    rest = [f for f in files if f.key not in deferred]
    failing = find_unreadable(rest, reader.check, known_to_fail=not deferred)
    for f in rest:  # a file that failed because it vanished or changed while it was read: deferred too
        if f.key in failing and (why := gone_or_changed(f)) is not None:
            deferred[f.key] = why
            del failing[f.key]
    out = Isolated([f for f in rest if f.key not in failing and f.key not in deferred], deferred=deferred)
    if not failing and not deferred:
        raise error
    if deferred:
        note_deferred_files(ctx, [f for f in files if f.key in deferred], deferred)
        ctx.healing.skipped_files.update(deferred)
    adapter = ctx.adapter()
    for f in rest:
        if f.key in failing:
            why = reason_of(failing[f.key])
            ctx.healing.quarantined_files[f.key] = why  # a retry of the step does not read it again
            adapter.quarantine_files(ctx, [f], why)
            out.quarantined.append(f.with_status(QUARANTINED, why))
    ctx.log.warning("%s: a batch read failed (%s); %d file(s) quarantined, %d left for the next run, %d read on",
                    ctx.target.identifier, reason_of(error)[:200], len(out.quarantined), len(out.deferred),
                    len(out.good))
    return out


def rebuilt(batch: Batch, iso: Isolated) -> Batch | None:
    """`batch` over its good files only (None: none is left), its checkpoint property saying what
    became of the others (quarantined: recorded; deferred: not recorded, the next run plans them)."""
    if not iso.good or batch.reader is None:
        return None
    props = dict(batch.snapshot_properties)
    if CHECKPOINT_PROPERTY in props:
        bad = {f.key: f for f in iso.quarantined}
        entries = []
        for entry in json.loads(props[CHECKPOINT_PROPERTY]):
            if entry["key"] in iso.deferred:
                continue
            entries.append(bad[entry["key"]].as_checkpoint() if entry["key"] in bad else entry)
        props[CHECKPOINT_PROPERTY] = json.dumps(entries, separators=(",", ":"))
    label = f"{batch.label} (without {len(batch.files) - len(iso.good)} unreadable file(s))"
    return dataclasses.replace(batch, df=batch.reader.frame(iso.good), files=iso.good, snapshot_properties=props,
                               label=label)


def read_isolating(ctx: StageContext, files: list[FileRef], reader: FileReader) -> tuple[Any, list[FileRef]] | None:
    """(the engine's frame over `files`, the files in it): an eager engine's read of a batch, with
    the failing files set aside (None: none of them could be read)."""
    while files:
        try:
            return reader.frame(files), files
        except Exception as exc:
            if not per_file(exc):
                raise
            files = isolate(ctx, files, reader, exc).good
    return None


def write_isolating(ctx: StageContext, batch: Batch, write: Callable[[Batch], T]) -> tuple[T, Batch] | None:
    """`write(batch)`; when it fails reading one of the batch's files, the batch without the failing
    files is written instead (None: none of them could be read). Returns the write's result and the
    batch that was written."""
    while True:
        try:
            return write(batch), batch
        except Exception as exc:
            if batch.reader is None or not batch.files or not per_file(exc):
                raise
            nxt = rebuilt(batch, isolate(ctx, batch.files, batch.reader, exc))
            if nxt is None:
                return None
            batch = nxt
