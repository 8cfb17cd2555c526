"""File batches are bounded by bytes as well as by files: the demo's small landing is one
checkpointed commit, a large landing still commits (and checkpoints) every `batch_bytes`."""

from __future__ import annotations

from pathlib import Path

from lakehouse.ingest.files import batches
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.core import FileRef, HealingState

DEMO = Path(__file__).resolve().parent.parent / "metadata" / "demo"
MiB = 1024**2


def refs(*sizes: int) -> list[FileRef]:
    return [FileRef(f"f{i}", s, f"e{i}") for i, s in enumerate(sizes)]


def keys(chunks: list[list[FileRef]]) -> list[list[str]]:
    return [[f.key for f in c] for c in chunks]


def test_the_demo_landing_is_one_commit_and_a_large_landing_splits_by_bytes():
    src = next(s for s in load_metadata(DEMO).catalog.sources if s.source_id == "user_events_raw")
    assert (src.batch_files, src.batch_bytes) == (100, 256 * MiB)  # the defaults: the demo sets neither
    demo = refs(*[4 * MiB] * 8)  # what `lakehouse demo` lands for 200,000 events
    assert keys(batches(demo, src.batch_files, src.batch_bytes)) == [[f.key for f in demo]]
    large = refs(*[64 * MiB] * 10)  # 640 MiB: 4 + 4 + 2 files, every commit at most 256 MiB
    got = batches(large, src.batch_files, src.batch_bytes)
    assert [len(c) for c in got] == [4, 4, 2]
    assert all(sum(f.size for f in c) <= src.batch_bytes for c in got)
    assert [f for c in got for f in c] == large  # every file once, in order


def test_files_bytes_and_oversized_files():
    # the file count still bounds a batch of small files
    assert [len(c) for c in batches(refs(*[1] * 7), 3, 10**9)] == [3, 3, 1]
    # a file larger than batch_bytes is a commit of its own, never dropped or merged
    assert keys(batches(refs(10, 500, 10, 10), 100, 100)) == [["f0"], ["f1"], ["f2", "f3"]]
    assert batches([], 5, 5) == []
    assert keys(batches(refs(5, 5, 5), 2)) == [["f0", "f1"], ["f2"]]  # no byte bound: files only


def test_shrink_batch_halves_bytes_too():
    state = HealingState()
    state.batch_scale /= 2  # what healing's shrink_batch does on memory pressure
    files = refs(*[64 * MiB] * 8)
    got = batches(files, state.effective_batch(100), state.effective_batch(256 * MiB))
    assert [len(c) for c in got] == [2, 2, 2, 2]
