"""Dagster's local compute-log capture, mirrored to the terminal by a thread instead of children.

`LocalComputeLogManager.capture_logs` (Dagster's default) redirects a step's stdout and stderr to
files under `$DAGSTER_HOME/storage` (what the UI shows for a run's steps) and mirrors each file back
to the terminal through a `tail -F` child, watched by a second Python child (`watch_orphans.py`)
that kills the tail if the run's process dies: four processes per capture, two captures in a small
`lakehouse run` (~0.14 s of children's CPU and their fork/exec time per run, issue 21).

`ThreadMirrorComputeLogManager` is that manager with one change: the mirror is a thread of the
run's own process that follows the files (a read every `MIRROR_POLL_SECONDS`, and a last read to
the end once the capture ends, so the terminal sees all of a step's output; `tail -F`'s 1 s
interval can miss the end, dagster-io/dagster#23336). There is nothing to orphan, so no watcher.
The files, their names, the redirect of the file descriptors (a step's child processes write to
the same files), the completion marker, reading, subscriptions and deletion are Dagster's own, so
the UI and `instance.compute_log_manager` read a run's logs as before
(tests/test_compute_logs.py). Configure it in `dagster.yaml` (deploy/dagster.dev.yaml does):

    compute_logs:
      module: lakehouse.throughput.compute_logs
      class: ThreadMirrorComputeLogManager

`base_dir` defaults to Dagster's own default for a local instance, `$DAGSTER_HOME/storage`.
Private API: `redirect_to_file` (dagster._core.execution.compute_logs, the redirect Dagster's
capture uses), `IO_TYPE_EXTENSION` and `touch_file`; `capture_logs` and `from_config_value` are
the public `ComputeLogManager` / `ConfigurableClass` hooks.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager

from dagster import Field, StringSource
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._utils import ensure_file, touch_file

from lakehouse.settings import DagsterSettings, current

MIRROR_POLL_SECONDS = 0.1


def _fileno(stream) -> int | None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and ValueError
        return None
    return fd if isinstance(fd, int) else None


@contextmanager
def _mirrored(stream, path: str) -> Iterator[None]:
    """Redirect `stream` (its file descriptor) to `path` while a thread copies what is appended to
    `path` to where `stream` pointed before; the thread's last read is after the redirect ends."""
    ensure_file(path)
    fd = _fileno(stream)
    if fd is None:  # not a real file (a test runner's capture): Dagster's redirect does nothing either
        with redirect_to_file(stream, path):
            yield
        return
    out = os.dup(fd)  # the terminal (or pipe) the stream points at now
    done = threading.Event()

    def copy() -> None:
        with open(path, "rb") as src:  # from the file's first byte, as Dagster's `tail -F -c +0`
            while True:
                finished = done.is_set()
                while chunk := src.read(65536):
                    try:
                        os.write(out, chunk)
                    except OSError:  # the terminal is gone: the file still has everything
                        return
                if finished:
                    return
                done.wait(MIRROR_POLL_SECONDS)

    thread = threading.Thread(target=copy, name=f"compute-log-mirror-{fd}", daemon=True)
    try:
        with redirect_to_file(stream, path):
            thread.start()
            yield
    finally:
        done.set()
        if thread.ident is not None:  # started
            thread.join()
        os.close(out)


class ThreadMirrorComputeLogManager(LocalComputeLogManager):
    """`LocalComputeLogManager` whose terminal mirror is a thread, not `tail -F` + a watcher child."""

    def __init__(self, base_dir: str | None = None, polling_timeout: float | None = None, inst_data=None):
        if base_dir is None:  # Dagster's default for a local instance (dagster._core.instance.ref)
            base_dir = os.path.join(current(DagsterSettings).dagster_home or os.getcwd(), "storage")
        super().__init__(base_dir, polling_timeout=polling_timeout, inst_data=inst_data)

    @classmethod
    def config_type(cls):  # noqa: D102 - Dagster's ConfigurableClass hook
        return {"base_dir": Field(StringSource, is_required=False),
                "polling_timeout": Field(float, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 - Dagster's ConfigurableClass hook
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key) -> Generator[CapturedLogContext, None, None]:  # noqa: D102 - Dagster's hook
        outpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        errpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with ExitStack() as stack:
            stack.enter_context(_mirrored(sys.stdout, outpath))
            stack.enter_context(_mirrored(sys.stderr, errpath))
            yield CapturedLogContext(log_key)
        # leave artifact on filesystem so that we know the capture is completed (as Dagster's)
        touch_file(self.complete_artifact_path(log_key))
