"""Static checks of each stage, before any run: what Spark would otherwise refuse mid-run.

Every check works on the metadata alone (plus, when given, the live schemas of existing tables):
* the stage's SQL is exactly one query (a DROP, a second statement, an INSERT are refused);
* the columns it outputs (`lakehouse.metadata.derive`) hold every column its rules check, its
  target's merge keys, partition and sort columns, and every column its SQL reads;
* `expression` rules are one boolean expression over those columns;
* source and target agree (an incremental JDBC source needs a merge target on its primary key, a
  full load an overwrite, overwrite_partitions a partition spec).
A problem names the file (the .sql file and line for SQL), the key path, and the fix in plain words.
`metadata validate` / `apply` run these through `loader.check_references`; a run runs them again
against the live catalog before its first write (`lakehouse.runtime.preflight`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lakehouse.metadata.derive import (
    LiveSchemas,
    StageColumns,
    StageDerivation,
    derive_columns,
    stage_rules,
    stage_upstreams,
)
from lakehouse.metadata.engine_support import arrow_blockers
from lakehouse.metadata.model import MetadataCatalog, Rule, Source, Stage, Target
from lakehouse.metadata.periods import ADJECTIVE
from lakehouse.metadata.python_ref import reference_problem


@dataclass(frozen=True)
class Problem:
    where: str  # "file: key.path" or "file.sql:line:col"
    message: str  # what is wrong and how to fix it
    stage: tuple[str, str] | None = None  # (pipeline_id, stage_name) it belongs to

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


#: (section, key) -> "file: key.path" of a row; and the .sql file of a stage, if it came from one
Locate = Callable[[str, tuple], str]
SqlFile = Callable[[tuple], str | None]


def _cols(sc: StageColumns) -> str:
    names = list(sc.columns)
    return ", ".join(names[:40]) + (f" … ({len(names)} in all)" if len(names) > 40 else "")


def sql_location(locate: Locate, sql_file: SqlFile, stage: Stage, line: int | None, col: int | None) -> str:
    """`x.sql:3:14 (stage …, file: stages[i].transformation_file)` for SQL from a .sql file, else
    `file: stages[i].transformation` (the position then goes in the message: see `at_position`)."""
    where = locate("stages", stage.key())
    path = sql_file(stage.key())
    if path:
        pos = (f":{line}" + (f":{col}" if col else "")) if line else ""
        return f"{path}{pos} (stage {stage.pipeline_id}.{stage.stage_name}, {where}.transformation_file)"
    return f"{where}.transformation"


def at_position(sql_file: SqlFile, stage: Stage, line: int | None, col: int | None) -> str:
    """' at line 3, column 14' for inline SQL (whose location cannot carry it), else ''."""
    if sql_file(stage.key()) or not line:
        return ""
    return f" at line {line}" + (f", column {col}" if col else "")


def check_stages(catalog: MetadataCatalog, locate: Locate, sql_file: SqlFile, *, live: LiveSchemas | None = None,
                 planned: set[str] | None = None, only: set[tuple[str, str]] | None = None,
                 upstreams: Mapping[str, list[str]] | None = None) -> list[Problem]:
    """Every static problem of the stages (all, or those in `only` as (pipeline_id, stage_name));
    `upstreams` as for `derive_columns` (the stored tables other stages read: their SQL is not parsed)."""
    needed = None
    if only is not None:  # the stages asked for, and the datasets their referential rules look up
        needed = {s.target_id for s in catalog.stages if (s.pipeline_id, s.stage_name) in only}
        for s in catalog.stages:
            if (s.pipeline_id, s.stage_name) in only:
                needed |= {t.target_id for r in stage_rules(catalog, s) if r.type == "referential_integrity"
                           for t in catalog.targets if r.ref_dataset in (t.target_id, t.identifier)}
    derived = derive_columns(catalog, live, planned, needed, upstreams)
    targets = {t.target_id: t for t in catalog.targets}
    sources = {s.source_id: s for s in catalog.sources}
    problems: list[Problem] = []
    for stage in catalog.stages:
        sid = (stage.pipeline_id, stage.stage_name)
        if only is not None and sid not in only:
            continue
        out: list[Problem] = []

        def add(w: str, msg: str, _out: list[Problem] = out, _sid: tuple[str, str] = sid) -> None:
            _out.append(Problem(w, msg, _sid))

        if stage.transformation:
            from lakehouse.sql.parse import SqlParseError, shared_query  # sqlglot: only for stages with SQL

            try:
                shared_query(stage.transformation)
            except SqlParseError as exc:
                pos = at_position(sql_file, stage, exc.line, exc.col)
                msg = (f"cannot parse SQL{pos}: {exc.reason}" if str(exc).startswith("cannot parse")
                       else f"the stage's SQL {exc}")
                add(sql_location(locate, sql_file, stage, exc.line, exc.col), msg)
        if stage.sql_engine == "duckdb" and stage.transformation:
            from lakehouse.sql.parse import duckdb_problem

            problem = duckdb_problem(stage.transformation)
            if problem:
                add(f"{locate('stages', stage.key())}.sql_engine",
                    f"stage {stage.pipeline_id}.{stage.stage_name} runs on DuckDB, but its SQL "
                    f"({sql_file(stage.key()) or 'transformation'}) {problem}")
        if stage.python_transformation is not None:
            problem = reference_problem(stage.python_transformation.function)
            if problem:
                add(f"{locate('stages', stage.key())}.transformation.python",
                    f"python transformation of stage {stage.pipeline_id}.{stage.stage_name}: {problem}")
        target = targets.get(stage.target_id)
        sc = derived.get(stage.target_id)
        if sc is not None and sc.sql_error:
            e = sc.sql_error
            pos = at_position(sql_file, stage, e.get("line"), e.get("col"))
            add(sql_location(locate, sql_file, stage, e.get("line"), e.get("col")),
                f"the SQL{pos} reads {e['message']}. Fix the SQL, or the upstream stage so it outputs "
                f"{e.get('column')!r}")
        source = sources.get(stage.source_id or "")
        if target is not None and target.kind == "iceberg":
            if source is not None and not stage.transformation:
                for w, msg in _compatibility(source, target, locate):
                    add(w, msg)
            if target.engine == "arrow":
                blockers = arrow_blockers(stage, target, source, stage_rules(catalog, stage))
                if blockers:
                    add(f"{locate('targets', target.key())}.engine",
                        f"target {target.target_id!r} asks for engine arrow, which cannot write stage "
                        f"{stage.pipeline_id}.{stage.stage_name}: {'; '.join(blockers)}. Fix: engine: auto (Arrow "
                        "where it can, Spark elsewhere) or spark")
            if sc is not None:
                _target_columns(target, sc, locate, add)
        if stage.incremental is not None:
            for w, msg in _incremental_problems(catalog, stage, target, sc, locate):
                add(w, msg)
        if target is not None and target.kind == "iceberg" and target.time_partition is not None:
            for w, msg in _time_partition_problems(catalog, stage, target, sc, locate):
                add(w, msg)
        if sc is not None and target is not None:
            for i, rule in _rules_with_index(catalog, stage):
                rwhere = f"{locate('validation_rules', (stage.validation_set_id,))}.rules[{i}]"
                for msg in _rule_problems(rule, sc, target, derived, catalog):
                    add(rwhere, f"rule {rule.name!r} (stage {stage.pipeline_id}.{stage.stage_name}) {msg}")
        problems.extend(out)
    return problems


def unchecked(catalog: MetadataCatalog, live: LiveSchemas | None = None) -> list[str]:
    """Stages whose output columns cannot be known before a run, and why (said, never guessed)."""
    notes = []
    for tid, sc in derive_columns(catalog, live).items():
        if sc.unknown and not sc.sql_error:
            st = catalog.stage_for_target(tid)
            notes.append(f"stage {st.pipeline_id}.{st.stage_name}: columns not checkable before a run: {sc.unknown}")
    return notes


def _rules_with_index(catalog: MetadataCatalog, stage: Stage) -> list[tuple[int, Rule]]:
    return [(i, r) for i, r in enumerate(stage_rules(catalog, stage)) if r.enabled]


def _compatibility(src: Source, tgt: Target, locate: Locate) -> list[tuple[str, str]]:
    """Source and target write mode that cannot work together."""
    tw = locate("targets", tgt.key())
    out: list[tuple[str, str]] = []
    if src.kind == "jdbc" and src.load_type == "incremental":
        if tgt.write_mode != "merge":
            out.append((f"{tw}.write_mode", f"source {src.source_id!r} is an incremental JDBC load but target "
                        f"{tgt.target_id!r} has write_mode {tgt.write_mode!r}: rows re-read after an update would "
                        f"be duplicated. Fix: set write_mode: merge and merge_keys: {src.primary_key}"))
        elif [k.lower() for k in tgt.merge_keys] != [k.lower() for k in src.primary_key]:
            out.append((f"{tw}.merge_keys", f"target {tgt.target_id!r} merges on {tgt.merge_keys} but its incremental "
                        f"source {src.source_id!r} has primary_key {src.primary_key}. Fix: make them the same"))
    elif src.kind == "jdbc" and tgt.write_mode not in ("overwrite", "merge"):
        out.append((f"{tw}.write_mode", f"source {src.source_id!r} is a full JDBC load but target {tgt.target_id!r} "
                    f"has write_mode {tgt.write_mode!r}: every run would append the whole table again. Fix: set "
                    "write_mode: overwrite (atomic replace), or merge with merge_keys"))
    return out


def _target_columns(tgt: Target, sc: StageColumns, locate: Locate, add) -> None:
    """merge keys, partition and sort columns of the target must be columns the stage outputs."""
    tw = locate("targets", tgt.key())
    fields = [("merge_keys", k, f"merge_keys[{i}]") for i, k in enumerate(tgt.merge_keys if tgt.write_mode == "merge"
                                                                          else [])]
    fields += [("partition_spec", p.column, f"partition_spec[{i}].column") for i, p in enumerate(tgt.partition_spec)]
    fields += [("sort_order", s.column, f"sort_order[{i}].column") for i, s in enumerate(tgt.sort_order)]
    for what, column, path in fields:
        if sc.has(column) is False:
            add(f"{tw}.{path}", f"{what} column {column!r} is not a column of {tgt.identifier}, which gets "
                f"({_cols(sc)}) from {sc.origin}. Fix: name one of those columns, or make the stage output "
                f"{column!r}")
    if tgt.write_mode == "overwrite_partitions" and not tgt.partition_spec:
        add(f"{tw}.write_mode", f"write_mode overwrite_partitions on {tgt.identifier}, which has no partition_spec, "
            "would replace the whole table on every run. Fix: add a partition_spec, or use overwrite")


def _incremental_problems(catalog: MetadataCatalog, stage: Stage, tgt: Target | None, sc: StageColumns | None,
                          locate: Locate) -> list[tuple[str, str]]:
    """An incremental stage (lakehouse.stage.incremental) is a SQL stage over one table (or several, naming
    the one read incrementally), whose target a full
    recompute can overwrite, and whose keys / ordering / partition column are output columns."""
    inc = stage.incremental
    w = f"{locate('stages', stage.key())}.incremental"
    name = f"stage {stage.pipeline_id}.{stage.stage_name}"
    out: list[tuple[str, str]] = []
    if not stage.transformation:
        return [(w, f"{name} is incremental but has no SQL transformation: only SQL stages over an Iceberg table "
                 "read incrementally. Fix: remove `incremental`")]
    ups = stage_upstreams(catalog, stage)
    if inc.upstream is not None and inc.upstream not in ups:
        out.append((f"{w}.upstream", f"{name} reads {inc.upstream!r} incrementally but its SQL reads "
                    f"{', '.join(ups) or 'no table'}. Fix: name one of those tables"))
    elif not ups:
        out.append((w, f"{name} is incremental but its SQL reads no table: an incremental stage reads an upstream "
                    "table's changes. Fix: remove `incremental`"))
    elif len(ups) > 1 and inc.upstream is None:
        out.append((w, f"{name} is incremental but its SQL reads {', '.join(ups)}: say which one is read "
                    "incrementally (its changes drive the run; the others are read in full and a change to them "
                    "means a full recompute). Fix: add `upstream: <one of them>` to `incremental`, or remove "
                    "`incremental`"))
    if tgt is None or tgt.kind != "iceberg":
        return out
    tw = locate("targets", tgt.key())
    if tgt.write_mode != "overwrite":
        out.append((f"{tw}.write_mode", f"{name} is incremental, so its target {tgt.target_id!r} needs write_mode "
                    f"overwrite (what its full recompute does), not {tgt.write_mode!r}. Fix: set write_mode: overwrite"))
    columns = [(f"merge_keys[{i}]", k) for i, k in enumerate(inc.merge_keys)]
    columns += [(f, getattr(inc, f)) for f in ("order_by", "partition_column") if getattr(inc, f)]
    for path, column in columns:
        if sc is not None and sc.has(column) is False:
            out.append((f"{w}.{path}", f"{column!r} is not a column {name} outputs ({_cols(sc)}). Fix: name one "
                        "of those columns"))
    if inc.mode == "partitions":
        out += _identity_partition(tgt, inc.partition_column, f"{name} recomputes partitions of "
                                   f"{inc.partition_column!r}", locate)
        if inc.upstream_partition and (why := _parse_problem(inc.upstream_partition)):
            out.append((f"{w}.upstream_partition", why))
    return out


def _identity_partition(tgt: Target, column: str, because: str, locate: Locate) -> list[tuple[str, str]]:
    if any(p.column.lower() == column.lower() and p.transform == "identity" for p in tgt.partition_spec):
        return []
    return [(f"{locate('targets', tgt.key())}.partition_spec", f"{because}, so target {tgt.target_id!r} needs the "
             f"identity partition {column!r}. Fix: add {{column: {column}, transform: identity}} to its partition_spec")]


def _parse_problem(expression: str) -> str | None:
    """Why `expression` is not one Spark SQL expression, or None."""
    import sqlglot

    try:
        sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError as exc:
        return (f"cannot parse {expression!r} as a Spark SQL expression: {str(exc).splitlines()[0].rstrip('.')}. "
                "Fix: one expression over the upstream's columns, e.g. CAST(event_ts AS DATE)")
    return None


def _time_partition_problems(catalog: MetadataCatalog, stage: Stage, tgt: Target, sc: StageColumns | None,
                             locate: Locate) -> list[tuple[str, str]]:
    """A time-partitioned target is written by a SQL stage over one table, identity-partitioned by its
    date column, which the stage outputs."""
    tp = tgt.time_partition
    w = f"{locate('targets', tgt.key())}.time_partition"
    name = f"stage {stage.pipeline_id}.{stage.stage_name}"
    kind = ADJECTIVE[tp.granularity]
    if not stage.transformation or len(stage_upstreams(catalog, stage)) != 1:
        return [(w, f"target {tgt.target_id!r} has {kind} partitions, so {name} must be a SQL transformation "
                 f"reading exactly one upstream table (a {tp.granularity} is recomputed from that table's rows of "
                 f"the {tp.granularity}). Fix: remove time_partition, or make the stage one such query")]
    out: list[tuple[str, str]] = []
    if sc is not None and sc.has(tp.column) is False:
        out.append((f"{w}.column", f"{tp.column!r} is not a column {name} outputs ({_cols(sc)})"))
    elif sc is not None and (typ := (sc.columns.get(tp.column.lower()) or "").lower()):
        want = "timestamp" if tp.granularity == "hour" else "date"
        if typ.split("(")[0] not in ((want, "timestamp_ntz", "timestamp_ltz") if want == "timestamp" else (want,)):
            out.append((f"{w}.column", f"{name} outputs {tp.column!r} as {typ}, but {kind} partitions hold a "
                        f"{want.upper()} ({'the hour' if want == 'timestamp' else 'the ' + tp.granularity}'s start). "
                        f"Fix: output it as a {want.upper()}, e.g. "
                        + ("date_trunc('HOUR', ts)" if tp.granularity == "hour" else
                           "CAST(date_trunc('MONTH', ts) AS DATE)" if tp.granularity == "month" else "CAST(ts AS DATE)")))
    out += _identity_partition(tgt, tp.column, f"target {tgt.target_id!r} has {kind} partitions of {tp.column!r}",
                               locate)
    if tp.upstream and (why := _parse_problem(tp.upstream)):
        out.append((f"{w}.upstream", why))
    return out


def _rule_problems(rule: Rule, sc: StageColumns, tgt: Target, derived: dict[str, StageColumns],
                   catalog: MetadataCatalog) -> list[str]:
    out: list[str] = []
    fix = "Fix: use one of those columns, or make the stage output it"
    cols = ([rule.column] if rule.column else []) + list(rule.columns)
    missing = [c for c in cols if sc.has(c) is False]
    if missing:
        out.append(f"checks column(s) {missing}, which {tgt.identifier} does not have (its columns: {_cols(sc)}, "
                   f"from {sc.origin}). {fix}")
    if rule.type == "schema_contract":
        gone = [c.name for c in rule.expected_columns if sc.has(c.name) is False]
        if gone:
            out.append(f"expects column(s) {gone}, which {tgt.identifier} does not have (its columns: {_cols(sc)}, "
                       f"from {sc.origin}): the contract would fail on every run. Fix: correct expected_columns, or "
                       "the stage's output")
    if rule.type == "expression" and rule.expression:
        out.extend(_expression_problems(rule, sc))
    if rule.type == "referential_integrity" and rule.ref_dataset:
        ref = next((t for t in catalog.targets if rule.ref_dataset in (t.target_id, t.identifier if t.kind == "iceberg"
                                                                       else None)), None)
        ref_sc = derived.get(ref.target_id) if ref is not None else None
        if ref_sc is not None:
            gone = [c for c in rule.ref_columns if ref_sc.has(c) is False]
            if gone:
                out.append(f"looks up ref_columns {gone} in {rule.ref_dataset}, which does not have them (its "
                           f"columns: {_cols(ref_sc)}). Fix: name columns of {rule.ref_dataset}")
        if len(rule.ref_columns) != len(rule.columns):
            out.append(f"pairs {len(rule.columns)} column(s) with {len(rule.ref_columns)} ref_columns. Fix: give "
                       "as many ref_columns as columns, in the same order")
    return out


def _expression_problems(rule: Rule, sc: StageColumns) -> list[str]:
    error, names = _expression_columns(rule.expression, rule.name)
    if error:
        return [f"{error}. Fix: write one Spark SQL boolean condition over the row's columns, e.g. `amount >= 0`"]
    missing = [n for n in names if sc.has(n) is False]
    if missing:
        return [f"expression {rule.expression!r} uses column(s) {missing}, which the dataset does not have (its "
                f"columns: {_cols(sc)}, from {sc.origin}). Fix: use those columns"]
    return []


@functools.lru_cache(maxsize=4096)
def _expression_columns(expression: str, rule_name: str) -> tuple[str | None, tuple[str, ...]]:
    """(why it is not one row-level boolean expression, or None; the columns it reads)."""
    import sqlglot
    from sqlglot import exp

    from lakehouse.validation.rules import RuleError, check_expression

    try:
        check_expression(expression, rule_name)
    except RuleError as exc:
        return str(exc).replace(f"rule {rule_name!r}: ", "", 1), ()
    tree = sqlglot.parse_one(expression, read="spark")
    return None, tuple(sorted({c.parts[0].name for c in tree.find_all(exp.Column) if c.parts}))


# ------------------------------------------------------------------------------ re-apply: check what changed
@dataclass(frozen=True)
class Baseline:
    """The metadata as stored before an apply (it passed these checks when it was applied) and the
    derived rows that are up to date with it, by (pipeline_id, stage_name). A re-apply checks again
    only the stages whose answer can differ from then (`stages_to_check`)."""

    catalog: MetadataCatalog
    derived: Mapping[tuple[str, str], StageDerivation]


class _Inputs:
    """The rows a stage's checks read besides other stages' columns: the stage, its target, its
    source (or the target it names), its rule set; looked up in dicts built once per catalog."""

    def __init__(self, catalog: MetadataCatalog):
        self.targets = {t.target_id: t for t in catalog.targets}
        self.sources = {s.source_id: s for s in catalog.sources}
        self.rule_sets = {r.rule_set_id: r for r in catalog.validation_rules}
        self.stages = {(s.pipeline_id, s.stage_name): s for s in catalog.stages}

    def of(self, stage: Stage) -> tuple:
        return (stage, self.targets.get(stage.target_id), self.sources.get(stage.source_id or ""),
                self.targets.get(stage.source_id or ""), self.rule_sets.get(stage.validation_set_id or ""))


def unchanged_reads(baseline: Baseline, after: MetadataCatalog) -> dict[tuple[str, str], list[str]]:
    """{(pipeline_id, stage_name): the tables it reads, as stored} for every stage of `after` whose
    own inputs (`_Inputs`) are what they were in the baseline and whose stored derivation is up to
    date: those stages' SQL need not be parsed again."""
    before, now = _Inputs(baseline.catalog), _Inputs(after)
    out: dict[tuple[str, str], list[str]] = {}
    for key, st in now.stages.items():
        d, old = baseline.derived.get(key), before.stages.get(key)
        if d is not None and old is not None and before.of(old) == now.of(st):
            out[key] = list(d.upstream_tables)
    return out


def stages_to_check(after: MetadataCatalog, unchanged: Mapping[tuple[str, str], list[str]]) -> set[tuple[str, str]]:
    """The stages whose static checks can answer otherwise than for the baseline: the changed ones
    (not in `unchanged`), every stage downstream of them (the columns it reads may have changed,
    breaking its SQL or its rules), and every stage whose referential rule looks up a table one of
    those writes. What the live tables hold is checked by each run before its first write
    (lakehouse.runtime.preflight), not by a re-apply of unchanged stages."""
    import networkx as nx

    producer = {t.identifier.lower(): t.target_id for t in after.targets if t.kind == "iceberg"}
    writer = {s.target_id: (s.pipeline_id, s.stage_name) for s in after.stages}
    graph = nx.DiGraph()
    for st in after.stages:
        key = (st.pipeline_id, st.stage_name)
        graph.add_node(key)
        reads = unchanged.get(key)
        for ident in (reads if reads is not None else stage_upstreams(after, st)):
            up = writer.get(producer.get(ident, ""))
            if up is not None:
                graph.add_edge(up, key)
    todo = {k for k in graph.nodes if k not in unchanged}
    for k in list(todo):
        todo |= nx.descendants(graph, k)
    written = {s.target_id for s in after.stages if (s.pipeline_id, s.stage_name) in todo}
    written |= {t.identifier for t in after.targets if t.target_id in written and t.kind == "iceberg"}
    for st in after.stages:
        if any(r.type == "referential_integrity" and r.ref_dataset in written for r in stage_rules(after, st)):
            todo.add((st.pipeline_id, st.stage_name))
    return todo
