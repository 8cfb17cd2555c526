"""Bounded metadata (issue 40 item 3): what `lakehouse metadata validate` / `apply` read cannot exhaust
the machine or hang the command.

* a "billion laughs" (nested YAML aliases inside an `accepted_values` list), a recursive alias, a FIFO
  named `m.yaml` (in the directory, given as the path, or as a stage's `transformation_file`), a
  directory named like a YAML file, a 100 MB file: each refused with a clear error naming the file;
* the command-line ones in a real process under an address-space cap (RLIMIT_AS) and a timeout: it
  exits 2 with the error, it is not killed, and its peak memory is measured (its VmHWM);
* the limits are settings (`lakehouse.settings.MetadataLimits`): per file, per directory, files per
  directory, nodes the aliases may add; aliases within the budget still work.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.settings import MetadataLimits

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"

#: nine levels of nine: 9**9 (387 million) values once expanded, from a 700-byte file
LAUGHS = """\
pipelines: [{pipeline_id: p}]
validation_rules:
  - rule_set_id: lol
    rules:
      - name: laughs
        type: accepted_values
        column: c
        values:
          - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
          - &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
          - &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
          - &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
          - &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
          - &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
          - &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
          - &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
          - &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""

CAP_MB = 1024  # address space of the command under test: the Python process itself needs ~0.5 GB of it


def demo_copy(tmp_path: Path) -> Path:
    d = tmp_path / "meta"
    for p in DEMO.rglob("*"):
        if p.is_file():
            (d / p.relative_to(DEMO)).parent.mkdir(parents=True, exist_ok=True)
            (d / p.relative_to(DEMO)).write_bytes(p.read_bytes())
    return d


def lakehouse_capped(tmp_path: Path, *args: str, cap_mb: int = CAP_MB, timeout: float = 120,
                     env: dict[str, str] | None = None) -> tuple[int, str, float, float]:
    """(exit code, stdout+stderr, seconds, peak RSS in MB: VmHWM, polled) of `python -m lakehouse *args` under an
    address-space cap; a command still running at `timeout` is killed and the test fails."""
    out = tmp_path / f"out-{time.monotonic_ns()}.txt"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_mb * 1024**2, cap_mb * 1024**2))

    full_env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path / "home"), **(env or {})}
    start = time.monotonic()
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "lakehouse", *args], stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env, preexec_fn=cap, cwd=tmp_path)
    peak_kb = 0  # the process's own high-water mark (wait4's ru_maxrss also counts the forking parent's)
    while True:
        peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - start > timeout:
            proc.kill()
            proc.wait()
            pytest.fail(f"`lakehouse {' '.join(args)}` still running after {timeout} s: {out.read_text()[-2000:]}")
        time.sleep(0.02)
    seconds = time.monotonic() - start
    text = out.read_text(errors="replace")
    assert not os.WIFSIGNALED(status), f"killed by signal {os.WTERMSIG(status)}: {text[-2000:]}"
    return os.waitstatus_to_exitcode(status), text, seconds, peak_kb / 1024


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


# --------------------------------------------------------------------------- in a real process, capped


@pytest.mark.slow  # a real capped process: seconds of interpreter start-up
def test_a_billion_laughs_is_refused_by_validate_and_apply_in_bounded_memory(tmp_path):
    meta = demo_copy(tmp_path)
    (meta / "laughs.yaml").write_text(LAUGHS)
    for action in ("validate", "apply"):
        target = meta if action == "validate" else meta / "laughs.yaml"
        code, text, seconds, rss = lakehouse_capped(tmp_path, "metadata", action, str(target))
        assert code == 2, text
        assert f"{meta / 'laughs.yaml'}: its YAML aliases expand" in text, text
        assert "LAKEHOUSE_METADATA_MAX_ALIAS_NODES" in text and "billion laughs" in text
        assert seconds < 60 and rss < 400, (action, seconds, rss)
        assert "applied" not in text


@pytest.mark.slow  # a real capped process: seconds of interpreter start-up
def test_a_fifo_in_the_directory_is_refused_not_waited_on(tmp_path):
    meta = demo_copy(tmp_path)
    os.mkfifo(meta / "m.yaml")
    code, text, seconds, rss = lakehouse_capped(tmp_path, "metadata", "validate", str(meta), timeout=60)
    assert code == 2, text
    assert f"{meta / 'm.yaml'}: a FIFO (named pipe), not a regular file" in text, text
    assert seconds < 30 and rss < 400
    code, text, _, _ = lakehouse_capped(tmp_path, "metadata", "validate", str(meta / "m.yaml"), timeout=60)
    assert code == 2 and f"{meta / 'm.yaml'}: a FIFO (named pipe), not a regular file" in text, text


@pytest.mark.slow  # a real capped process: seconds of interpreter start-up
def test_a_100_mb_file_is_refused_before_it_is_read(tmp_path):
    meta = tmp_path / "big"
    meta.mkdir()
    line = b"  - {pipeline_id: p%07d}\n"
    with (meta / "pipelines.yaml").open("wb") as f:  # 1.15 M pipelines' worth of ~90 bytes each, quickly
        f.write(b"pipelines:\n")
        block = b"".join(line % i for i in range(100_000))
        while f.tell() < 100 * 1024**2:
            f.write(block)
    code, text, seconds, rss = lakehouse_capped(tmp_path, "metadata", "validate", str(meta))
    assert code == 2, text
    size = (meta / "pipelines.yaml").stat().st_size
    assert f"{meta / 'pipelines.yaml'}: {size:,} bytes, over the limit of 33,554,432 bytes" in text and "over the limit of 33,554,432 bytes for one metadata " \
        "file (LAKEHOUSE_METADATA_MAX_FILE_BYTES)" in text, text
    assert seconds < 30 and rss < 400, (seconds, rss)


@pytest.mark.slow
def test_a_large_valid_file_validates_in_memory_proportional_to_it(tmp_path):
    """Just under the per-file limit (25 MB, 240,000 pipelines with retry policies): valid, and the
    peak memory stays a bounded multiple of the input (PyYAML's nodes and objects, then the
    entities: about 50x measured; the test allows 60x and 100 MB)."""
    meta = tmp_path / "many"
    meta.mkdir()
    with (meta / "pipelines.yaml").open("w") as f:
        f.write("retry_policies: [{retry_id: r, max_retries: 2}]\npipelines:\n")
        for i in range(240_000):
            f.write(f"  - {{pipeline_id: p{i:07d}, default_retry_id: r, description: pipeline {i}}}\n")
    size_mb = (meta / "pipelines.yaml").stat().st_size / 1024**2
    code, text, seconds, rss = lakehouse_capped(tmp_path, "metadata", "validate", str(meta), cap_mb=2560,
                                                timeout=600)
    assert code == 0 and "valid (240000 pipelines 1 retry_policies)" in text.replace(",", ""), text
    print(f"{size_mb:.1f} MB validated in {seconds:.1f} s, peak RSS {rss:.0f} MB")
    assert rss < 100 + 60 * size_mb


# --------------------------------------------------------------------------- in process: each limit


def limits(**given) -> MetadataLimits:
    return MetadataLimits(**given)


def problems(path: Path, **given) -> list[str]:
    with pytest.raises(MetadataError) as exc:
        load_metadata(path, limits=limits(**given))
    return exc.value.problems


def test_aliases_within_the_budget_load_and_over_it_are_refused(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("""\
validation_rules:
  - rule_set_id: a
    rules: &shared
      - {name: known, type: accepted_values, column: c, values: &v [x, y, z]}
      - {name: present, type: not_null, columns: [c]}
  - rule_set_id: b
    rules: *shared
  - rule_set_id: c
    rules: [{name: known, type: accepted_values, column: d, values: *v}]
""")
    loaded = load_metadata(path, check_refs=False)
    assert [len(rs.rules) for rs in loaded.catalog.validation_rules] == [2, 2, 1]
    assert loaded.catalog.validation_rules[2].rules[0].values == ["x", "y", "z"]
    (prob,) = problems(path, metadata_max_alias_nodes=0)
    assert prob.startswith(f"{path}: its YAML aliases expand ") and "over the limit of 0" in prob, prob
    (prob,) = problems(path, metadata_max_alias_nodes=10)  # `*shared` adds its 21 nodes, `*v` its 4
    assert "expand 45 written nodes by 25, over the limit of 10" in prob, prob
    assert len(load_metadata(path, check_refs=False, limits=limits(metadata_max_alias_nodes=25)).catalog
               .validation_rules) == 3


def test_a_recursive_alias_and_a_directory_named_yaml_are_refused(tmp_path):
    (tmp_path / "loop.yaml").write_text("pipelines: &p [{pipeline_id: a, tags: *p}]\n")
    (tmp_path / "dir.yaml").mkdir()
    found = problems(tmp_path)
    assert found == [
        f"{tmp_path / 'dir.yaml'}: a directory, not a regular file: metadata is read from regular files only. "
        "Fix: remove it or rename it",
        f"{tmp_path / 'loop.yaml'}: line 1: a YAML alias refers to a node that contains it (a recursive "
        "structure); metadata is a tree. Fix: write the values out"], found


def test_a_fifo_as_a_stages_sql_file_is_refused_naming_the_field(tmp_path):
    meta = demo_copy(tmp_path)
    fifo = meta / "sql" / "silver_user_events.sql"
    fifo.unlink()
    os.mkfifo(fifo)
    start = time.monotonic()
    found = problems(meta)
    assert time.monotonic() - start < 30
    (prob,) = [p for p in found if "transformation_file" in p]
    assert prob.startswith(f"{meta / 'user_events.yaml'}: stages[") and f"{fifo}: a FIFO (named pipe)" in prob, prob


def test_a_fifo_swapped_in_after_the_listing_does_not_block(tmp_path):
    """The reader opens without blocking: a writer-less FIFO opened for reading would wait for ever."""
    from lakehouse.metadata.loader import BoundedReader, RefusedFile

    fifo = tmp_path / "x.yaml"
    os.mkfifo(fifo)
    reader = BoundedReader(limits())
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the read blocked"))
    signal.alarm(20)
    try:
        with pytest.raises(RefusedFile, match="a FIFO"):
            reader.read(fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_size_and_count_limits_name_the_file_and_the_setting(tmp_path):
    meta = tmp_path / "meta"
    meta.mkdir()
    for i in range(4):
        (meta / f"p{i}.yaml").write_text("pipelines:\n" + "".join(f"  - {{pipeline_id: p{i}_{j:05d}}}\n"
                                                                  for j in range(1000)))
    size = (meta / "p0.yaml").stat().st_size
    assert len(load_metadata(meta, limits=limits()).catalog.pipelines) == 4000
    (prob,) = problems(meta, metadata_max_file_bytes=size - 1, metadata_max_bytes=10 * size)[:1]
    assert prob == (f"{meta / 'p0.yaml'}: {size:,} bytes, over the limit of {size - 1:,} bytes for one metadata "
                    "file (LAKEHOUSE_METADATA_MAX_FILE_BYTES). Fix: split it into several files, or raise the limit")
    found = problems(meta, metadata_max_bytes=int(2.5 * size))
    assert [p.split(":")[0] for p in found] == [str(meta / "p2.yaml"), str(meta / "p3.yaml")], found
    assert "over the limit of" in found[0] and "(LAKEHOUSE_METADATA_MAX_BYTES)" in found[0]
    (prob,) = problems(meta, metadata_max_files=3)
    assert prob == (f"{meta}: more than 3 YAML files, over the limit of LAKEHOUSE_METADATA_MAX_FILES. Fix: apply "
                    "the directory in parts, or raise the limit")


def test_the_limits_are_settings_read_from_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("pipelines: [{pipeline_id: a}]\n")
    monkeypatch.setenv("LAKEHOUSE_METADATA_MAX_FILE_BYTES", "10")
    with pytest.raises(MetadataError, match="over the limit of 10 bytes"):
        load_metadata(path)
    monkeypatch.delenv("LAKEHOUSE_METADATA_MAX_FILE_BYTES")
    assert load_metadata(path).catalog.pipelines[0].pipeline_id == "a"


@pytest.mark.slow  # a real capped process: seconds of interpreter start-up
def test_sql_import_reads_its_file_within_the_same_limits(tmp_path):
    fifo = tmp_path / "seed.sql"
    os.mkfifo(fifo)
    code, text, seconds, _ = lakehouse_capped(tmp_path, "sql", "import", str(fifo), "--metadata", str(DEMO),
                                              timeout=60)
    assert code == 2 and f"error: {fifo}: a FIFO (named pipe), not a regular file" in text, text
    big = tmp_path / "big.sql"
    big.write_text("INSERT INTO gold.x SELECT 1 AS a FROM silver.user_events;\n" * 100)
    code, text, _, _ = lakehouse_capped(tmp_path, "sql", "import", str(big), "--metadata", str(DEMO), timeout=60,
                                        env={"LAKEHOUSE_METADATA_MAX_FILE_BYTES": "5000"})
    assert code == 2 and f"error: {big}: 5,800 bytes, over the limit of 5,000 bytes" in text, text
