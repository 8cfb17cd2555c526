"""Loads the declarative YAML form of the metadata and validates it as a whole.

Every error names the file, the key path inside it and the reason, and a directory is
accepted or rejected as a unit, so `metadata apply` never half-applies anything.

What is read is bounded (issue 40, `lakehouse.settings.MetadataLimits`): only regular files (a FIFO
would block the reader for ever, a device never ends), each under a size limit and all of them under
another, at most so many files, and YAML aliases may add only so many nodes when expanded (a "billion
laughs" of nested aliases is nine lines that expand to a billion values). Each limit is checked
before the file is parsed, so validation needs memory in proportion to its input.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lakehouse.metadata.engine_support import entity_raw_blockers
from lakehouse.metadata.model import SECTIONS, Entity, MetadataCatalog, Stage
from lakehouse.settings import MetadataLimits, current, env_name


class MetadataError(ValueError):
    """One or more problems in metadata; `problems` lists them as 'file: path: reason'."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid metadata:\n  " + "\n  ".join(problems))


@dataclass
class Origin:
    file: str
    path: str  # e.g. stages[2]
    sql_file: str | None = None  # a stage's transformation_file, resolved

    def __str__(self) -> str:
        return f"{self.file}: {self.path}"


@dataclass
class LoadedMetadata:
    catalog: MetadataCatalog
    origins: dict[tuple[str, tuple], Origin] = field(default_factory=dict)
    base_dir: Path | None = None


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML loader that rejects duplicate mapping keys instead of silently keeping the last. On
    libyaml's parser when PyYAML has it (about 10x faster than the pure-Python one: a thousand
    pipelines are tens of thousands of lines), the same safe constructors either way."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class RefusedFile(ValueError):
    """A file `BoundedReader` refuses (the message says why; the caller names the file)."""


#: what a path that is not a regular file is, for the message
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    what = next((kind for test, kind in _KINDS if test(mode)), "a special file")
    return f"{what}, not a regular file: metadata is read from regular files only. Fix: remove it or rename it"


class BoundedReader:
    """Reads the files of one metadata directory within `MetadataLimits`: regular files only, each at
    most `metadata_max_file_bytes`, all together at most `metadata_max_bytes`. A refused file raises
    `RefusedFile` before anything of it is parsed."""

    def __init__(self, limits: MetadataLimits):
        self.limits = limits
        self.total = 0

    def read(self, path: Path) -> bytes:
        cap = self.limits.metadata_max_file_bytes
        try:  # stat first: a FIFO or a device is never opened
            why = _not_regular(os.stat(path).st_mode)
            if why:
                raise RefusedFile(why)
            # O_NONBLOCK: should a FIFO replace the file between the stat and the open, the open does not wait
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        except OSError as exc:
            raise RefusedFile(f"cannot be read: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            why = _not_regular(st.st_mode)
            if why:
                raise RefusedFile(why)
            self._check(st.st_size)
            chunks, size = [], 0
            while size <= cap:  # the file may grow while it is read: never more than the limit and a byte
                chunk = os.read(fd, min(1024**2, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            self._check(size)
            self.total += size
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _check(self, size: int) -> None:
        cap = self.limits.metadata_max_file_bytes
        if size > cap:
            raise RefusedFile(f"{size:,} bytes, over the limit of {cap:,} bytes for one metadata file "
                              f"({env_name('metadata_max_file_bytes')}). Fix: split it into several files, or raise "
                              "the limit")
        if self.total + size > self.limits.metadata_max_bytes:
            raise RefusedFile(f"with this file the metadata read reaches {self.total + size:,} bytes, over the limit "
                              f"of {self.limits.metadata_max_bytes:,} bytes for all metadata files together "
                              f"({env_name('metadata_max_bytes')}). Fix: apply the directory in parts, or raise the "
                              "limit")


def _node_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_aliases(root: yaml.Node, budget: int) -> None:
    """Refuses a composed YAML document whose aliases, expanded, add more than `budget` nodes to the
    ones written, or refer to themselves. The composer shares an aliased node; Python objects built
    from it are copied downstream (validation, JSON), so the expanded size is what costs memory. It
    is counted over the node graph once per node (memoised), never by expanding."""
    size: dict[int, int] = {}
    open_: set[int] = set()  # the nodes on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            size[key] = 1 + sum(size[id(c)] for c in _node_children(node))
            open_.discard(key)
            continue
        if key in size:
            continue
        open_.add(key)
        stack.append((node, True))
        for child in _node_children(node):
            if id(child) in open_:
                line = child.start_mark.line + 1 if child.start_mark else "?"
                raise RefusedFile(f"line {line}: a YAML alias refers to a node that contains it (a recursive "
                                  "structure); metadata is a tree. Fix: write the values out")
            if id(child) not in size:
                stack.append((child, False))
    added = size[id(root)] - len(size)
    if added > budget:
        raise RefusedFile(f"its YAML aliases expand {len(size):,} written nodes by {added:,}, over the limit of "
                          f"{budget:,} ({env_name('metadata_max_alias_nodes')}): nested aliases (a \"billion laughs\") "
                          "would exhaust memory. Fix: write the values out, or raise the limit")


def parse_yaml(text: str, limits: MetadataLimits) -> Any:
    """One YAML document: duplicate keys refused, aliases within `limits.metadata_max_alias_nodes`."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:  # an alias needs an anchor, and an anchor is written `&name`: none, nothing to count
            _check_aliases(node, limits.metadata_max_alias_nodes)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def metadata_files(path: Path, limits: MetadataLimits | None = None) -> list[Path]:
    """The YAML files of a metadata directory (at most `metadata_max_files`), or the one file `path`
    (whatever kind of file it is: the reader refuses what is not a regular file, naming it)."""
    if not path.is_dir():
        if not (path.exists() or path.is_symlink()):
            raise MetadataError([f"{path}: no such metadata file or directory"])
        return [path]
    cap = (limits or current(MetadataLimits)).metadata_max_files
    found: list[Path] = []
    for p in path.rglob("*"):
        if p.suffix in (".yaml", ".yml"):
            found.append(p)
            if len(found) > cap:
                raise MetadataError([f"{path}: more than {cap:,} YAML files, over the limit of "
                                     f"{env_name('metadata_max_files')}. Fix: apply the directory in parts, or "
                                     "raise the limit"])
    return sorted(found)


def confined_file(root: Path, base: Path, value: str, what: str) -> tuple[Path | None, str | None]:
    """(resolved path, None) for a file named in metadata, or (None, problem) when it escapes `root`.

    Metadata names files relative to itself and inside its own directory: an absolute path, a
    `..` that leaves the directory, or a symlink pointing outside is refused, so applying metadata
    can never copy a file from elsewhere on the machine into the control DB."""
    root_real = root.resolve()
    p = Path(value)
    if p.is_absolute():
        return None, (f"{value!r} is an absolute path; {what} must be a path relative to the metadata file, "
                      f"inside {root}")
    candidate = base / p
    real = candidate.resolve()
    if not real.is_relative_to(root_real):
        lexical = Path(os.path.normpath(candidate.absolute()))
        via = "through a symlink " if lexical.is_relative_to(os.path.normpath(root.absolute())) else ""
        return None, (f"{value!r} leads {via}outside the metadata directory {root} (to {real}); {what} must "
                      "stay inside it: move the file into the metadata directory")
    return real, None


def load_metadata(path: str | Path, *, check_refs: bool = True, live=None,
                  limits: MetadataLimits | None = None) -> LoadedMetadata:
    """Parse and validate every YAML file under `path` into one catalog.

    With check_refs=False only each row is validated (plus duplicate keys): `metadata apply` of a
    file that refers to rows already in the control DB is checked against the merged catalog instead.
    `live` (identifier -> {column: type}) lets the static checks use tables that already exist.
    `limits`: what may be read (default: the environment's, `lakehouse.settings.MetadataLimits`).
    Reads only: nothing is written anywhere.
    """
    limits = limits or current(MetadataLimits)
    reader = BoundedReader(limits)
    root = Path(path)
    root_dir = root if root.is_dir() else root.parent
    problems: list[str] = []
    rows: dict[str, list[tuple[Entity, Origin]]] = {s: [] for s in SECTIONS}
    for f in metadata_files(root, limits):
        rel = str(f)
        if root.is_dir() and not f.resolve().is_relative_to(root_dir.resolve()):
            problems.append(f"{rel}: a symlink to {f.resolve()}, outside the metadata directory {root_dir}; "
                            "copy the file into the directory instead")
            continue
        try:
            doc = parse_yaml(reader.read(f).decode("utf-8"), limits)
        except RefusedFile as exc:
            problems.append(f"{rel}: {exc}")  # a file over a limit is not read: the next ones may be
            continue
        except yaml.YAMLError as exc:
            problems.append(f"{rel}: YAML error: {exc}")
            continue
        except UnicodeDecodeError as exc:
            problems.append(f"{rel}: not UTF-8 text: {exc}")
            continue
        if doc is None:
            continue
        if not isinstance(doc, dict):
            problems.append(f"{rel}: top level must be a mapping of sections, got {type(doc).__name__}")
            continue
        for section, items in doc.items():
            if section not in SECTIONS:
                problems.append(f"{rel}: {section}: unknown section; known: {', '.join(SECTIONS)}")
                continue
            if not isinstance(items, list):
                problems.append(f"{rel}: {section}: must be a list of rows")
                continue
            model = SECTIONS[section]
            for i, item in enumerate(items):
                origin = Origin(rel, f"{section}[{i}]")
                if not isinstance(item, dict):
                    problems.append(f"{origin}: must be a mapping")
                    continue
                if model is Stage and item.get("transformation_file"):
                    item = dict(item)
                    value = str(item.pop("transformation_file"))
                    sql_path, why = confined_file(root_dir, f.parent, value, "transformation_file")
                    if why is None and sql_path.suffix.lower() != ".sql":
                        why = f"{value!r} is not a .sql file; transformation_file names the stage's SQL file"
                    if why is None and not sql_path.exists():
                        why = f"no such file {sql_path}"
                    if why is None:
                        try:
                            item["transformation"] = reader.read(sql_path).decode("utf-8")
                        except RefusedFile as exc:
                            why = f"{sql_path}: {exc}"
                        except UnicodeDecodeError as exc:
                            why = f"{sql_path} is not UTF-8 text: {exc}"
                    if why is not None:
                        problems.append(f"{origin}.transformation_file: {why}")
                        continue
                    origin.sql_file = str(sql_path)
                try:
                    rows[section].append((model.model_validate(item), origin))
                except ValidationError as exc:
                    for err in exc.errors():
                        problems.append(f"{origin}{_loc(err['loc'])}: {err['msg']}")
    if problems:
        raise MetadataError(problems)
    return build_catalog(rows, base_dir=root_dir, check_refs=check_refs, live=live)


def build_catalog(rows: dict[str, list[tuple[Entity, Origin]]], base_dir: Path | None = None,
                  check_refs: bool = True, live=None, baseline=None) -> LoadedMetadata:
    problems: list[str] = []
    origins: dict[tuple[str, tuple], Origin] = {}
    for section, items in rows.items():
        for entity, origin in items:
            k = (section, entity.key())
            if k in origins:
                problems.append(f"{origin}: duplicate key {entity.key()} in {section}, first defined at {origins[k]}")
            else:
                origins[k] = origin
    if problems:
        raise MetadataError(problems)
    catalog = MetadataCatalog(**{s: [e for e, _ in items] for s, items in rows.items()})
    loaded = LoadedMetadata(catalog, origins, base_dir)
    if check_refs:
        check_references(loaded, live=live, baseline=baseline)
    return loaded


def _where(loaded: LoadedMetadata, section: str, key: tuple) -> str:
    origin = loaded.origins.get((section, key))
    return str(origin) if origin else f"{section}{list(key)}"


def check_references(loaded: LoadedMetadata, live=None, baseline=None) -> None:
    """Cross-row checks: every reference resolves, stage dataflow is acyclic, targets are unique;
    then the static checks of every stage (lakehouse.metadata.checks), with `live` table schemas.

    `baseline` (a re-apply, lakehouse.metadata.checks.Baseline): the cross-row checks still cover
    every row, reading the tables an unchanged stage reads from its stored derivation instead of
    parsing its SQL; the static checks cover the stages whose answer can have changed."""
    from lakehouse.metadata.checks import check_stages, stages_to_check, unchanged_reads
    from lakehouse.sql.parse import SqlParseError, shared_query, tables_in_tree

    c = loaded.catalog
    stored_reads = unchanged_reads(baseline, c) if baseline is not None else {}
    problems: list[str] = []
    ids = {
        "pipeline": {p.pipeline_id for p in c.pipelines},
        "source": {s.source_id for s in c.sources},
        "target": {t.target_id for t in c.targets},
        "rule_set": {v.rule_set_id for v in c.validation_rules},
        "retry": {r.retry_id for r in c.retry_policies},
        "profile": {p.profile_id for p in c.profiles} | {"balanced", "focus"},
    }
    datasets = ids["source"] | ids["target"]

    def sql_file_of(key: tuple) -> str | None:
        origin = loaded.origins.get(("stages", key))
        return origin.sql_file if origin else None

    def sql_where(st: Stage) -> str:
        from lakehouse.metadata.checks import sql_location

        return sql_location(lambda s, k: _where(loaded, s, k), sql_file_of, st, None, None)

    def need(kind: str, value: Any, section: str, key: tuple, field_name: str) -> None:
        if value is not None and value not in ids[kind]:
            problems.append(
                f"{_where(loaded, section, key)}.{field_name}: unknown {kind.replace('_', ' ')} {value!r};"
                f" known: {sorted(ids[kind])}"
            )

    for p in c.pipelines:
        need("retry", p.default_retry_id, "pipelines", p.key(), "default_retry_id")
    for s in c.sources:
        if s.alternative_source_id is not None:
            need("source", s.alternative_source_id, "sources", s.key(), "alternative_source_id")
    for t in c.targets:
        if t.alternative_source_id is not None:
            need("source", t.alternative_source_id, "targets", t.key(), "alternative_source_id")
        if t.export_target_id is not None:
            need("target", t.export_target_id, "targets", t.key(), "export_target_id")
            if t.export_target_id in ids["target"] and c.target(t.export_target_id).kind != "warehouse":
                problems.append(f"{_where(loaded, 'targets', t.key())}.export_target_id: must name a warehouse target")
    seen_idents: dict[str, str] = {}
    for t in c.targets:
        if t.kind == "iceberg":
            ident = t.identifier.lower()
            if ident in seen_idents:
                problems.append(
                    f"{_where(loaded, 'targets', t.key())}: table {ident} is also target {seen_idents[ident]!r}"
                )
            seen_idents[ident] = t.target_id

    import networkx as nx  # validation only: loading the control DB's catalog (every step) does not need it

    graph = nx.DiGraph()
    target_writers: dict[str, tuple] = {}

    def lake_table(ident: str, at: str, reader: str) -> list[str]:
        """The target a stage reads as a lake table ([] and a problem naming the known tables if none)."""
        t = c.target_by_identifier(ident)
        if t is not None:
            return [t.target_id]
        problems.append(f"{at}: table {ident!r} is not the target of any stage; {reader} reads lake tables "
                        f"only: known tables {sorted(x.identifier for x in c.targets if x.kind == 'iceberg')}")
        return []

    for st in c.stages:
        key = st.key()
        where = _where(loaded, "stages", key)
        need("pipeline", st.pipeline_id, "stages", key, "pipeline_id")
        need("target", st.target_id, "stages", key, "target_id")
        if st.source_id is not None and st.source_id not in datasets:
            problems.append(f"{where}.source_id: unknown source {st.source_id!r}; known sources: "
                            f"{sorted(ids['source'])} (to read another stage's table, name its target_id)")
        need("rule_set", st.validation_set_id, "stages", key, "validation_set_id")
        need("retry", st.retry_id, "stages", key, "retry_id")
        if st.target_id in target_writers:
            problems.append(f"{where}.target_id: target {st.target_id!r} is already written by stage {target_writers[st.target_id]}")
        target_writers[st.target_id] = key
        if st.target_id in ids["target"] and c.target(st.target_id).kind != "iceberg":
            problems.append(f"{where}.target_id: a stage writes an iceberg target; warehouse targets are exports")
        upstream: list[str] = []
        if st.source_id:
            upstream.append(st.source_id)
        if st.transformation:
            try:
                reads = stored_reads.get((st.pipeline_id, st.stage_name))
                for ident in reads if reads is not None else tables_in_tree(shared_query(st.transformation)):
                    upstream.extend(lake_table(ident, sql_where(st), "a stage's SQL"))
            except SqlParseError:
                pass  # reported with its line by the static checks below
        if st.python_transformation is not None:
            for i, ident in enumerate(st.python_transformation.inputs):
                upstream.extend(lake_table(ident, f"{where}.transformation.inputs[{i}]", "a Python transformation"))
        for u in upstream:
            graph.add_edge(u, st.target_id)
    asset_keys: dict[tuple[str, str], Any] = {}  # the Dagster asset key is [layer, table]
    for st in c.stages:
        if st.target_id not in ids["target"]:
            continue
        tgt = c.target(st.target_id)
        akey = (st.layer, (tgt.table or "").lower())
        if akey in asset_keys:
            other = asset_keys[akey]
            problems.append(
                f"{_where(loaded, 'stages', st.key())}.target_id: asset key {st.layer}/{tgt.table} is also stage "
                f"{other.pipeline_id}.{other.stage_name} (target {other.target_id!r}); the asset key is "
                "layer/table, so rename one table or put it in another layer")
        asset_keys[akey] = st
    stage_names: dict[tuple, tuple] = {}
    for st in c.stages:
        k = (st.pipeline_id, st.stage_name)
        if k in stage_names:
            problems.append(f"{_where(loaded, 'stages', st.key())}.stage_name: duplicate stage name {st.stage_name!r} in pipeline {st.pipeline_id!r}")
        stage_names[k] = st.key()
    try:
        cycle = nx.find_cycle(graph)
        path = [e[0] for e in cycle] + [cycle[0][0]]
        writers = [f"{_where(loaded, 'stages', target_writers[t])} writes {t}" for t in path[:-1] if t in target_writers]
        first = _where(loaded, "stages", target_writers[path[1]]) if path[1] in target_writers else "stages"
        problems.append(f"{first}: cycle in dataflow: {' -> '.join(path)} ({'; '.join(writers)}): a stage reads, "
                        "through the others, the table it writes. Fix: make one of them read an earlier table")
    except nx.NetworkXNoCycle:
        pass

    for f in c.control_flags:
        if f.entity_type == "pipeline":
            need("pipeline", f.entity_id, "control_flags", f.key(), "entity_id")
        elif f.entity_type == "stage" and f.entity_id.split(".", 1)[0] not in ids["pipeline"]:
            problems.append(f"{_where(loaded, 'control_flags', f.key())}.entity_id: stage flag must be 'pipeline.stage'")
        elif f.entity_type in ("source", "target"):
            need(f.entity_type, f.entity_id, "control_flags", f.key(), "entity_id")
    for pp in c.pipeline_profiles:
        if pp.pipeline_id != "*":
            need("pipeline", pp.pipeline_id, "pipeline_profiles", pp.key(), "pipeline_id")
        need("profile", pp.profile_id, "pipeline_profiles", pp.key(), "profile_id")
    for th in c.throttles:
        kind = "source" if th.entity_type == "source" else "target"
        need(kind, th.entity_id, "throttles", th.key(), "entity_id")
    for a in c.applications:
        if a.source_id is not None:
            need("source", a.source_id, "applications", a.key(), "source_id")
        need("rule_set", a.validation_set_id, "applications", a.key(), "validation_set_id")
        if a.engine == "arrow":  # refused here, not at the first load (lakehouse.engines.choice.choose_for_application)
            sets = {rs.rule_set_id: rs.rules for rs in c.validation_rules}
            blockers = entity_raw_blockers(a, sets.get(a.validation_set_id or "", []))
            if blockers:
                problems.append(f"{_where(loaded, 'applications', a.key())}.engine: application {a.application_id!r} "
                                f"asks for engine arrow, which cannot load its entity_raw table: {'; '.join(blockers)}. "
                                "Fix: engine: auto (Arrow where it can, Spark elsewhere) or spark")
    for e in c.dataset_lineage:  # every route must join datasets the platform knows (issue 8)
        for fld in ("from_dataset_id", "to_dataset_id"):
            if getattr(e, fld) not in datasets:
                problems.append(f"{_where(loaded, 'dataset_lineage', e.key())}.{fld}: unknown dataset "
                                f"{getattr(e, fld)!r}; known: {sorted(datasets)}")
    for rp in c.dataset_recovery_paths:  # an operator's route must be one the runner can follow
        where = _where(loaded, "dataset_recovery_paths", rp.key())
        unknown = [d for d in rp.path_sequence if d not in datasets]
        if unknown:
            problems.append(f"{where}.path_sequence: unknown dataset(s) {unknown}; known: {sorted(datasets)}")
        elif len(rp.path_sequence) < 2 or rp.path_sequence[-1] != rp.dataset_id:
            problems.append(f"{where}.path_sequence: must hold at least an upstream and end with {rp.dataset_id!r}")
    for ch in c.alert_channels:
        for i, pid in enumerate(ch.pipelines):
            need("pipeline", pid, "alert_channels", ch.key(), f"pipelines[{i}]")
    for rs in c.validation_rules:
        for i, r in enumerate(rs.rules):
            if r.type == "referential_integrity" and r.ref_dataset not in datasets:
                problems.append(
                    f"{_where(loaded, 'validation_rules', rs.key())}.rules[{i}].ref_dataset: unknown dataset {r.ref_dataset!r}"
                )
    # the static checks of each stage; a cycle leaves the columns underivable, the SQL is still checked
    only = stages_to_check(c, stored_reads) if baseline is not None else None
    upstreams = {c.stage(*k).target_id: reads for k, reads in stored_reads.items()}
    problems.extend(str(p) for p in check_stages(c, lambda s, k: _where(loaded, s, k), sql_file_of, live=live,
                                                 only=only, upstreams=upstreams))
    if problems:
        raise MetadataError(problems)
