"""The write engines behind the one write-audit-publish service (lakehouse.stage.wap_service): Spark
(`lakehouse.engines.spark`) and PyIceberg + Arrow without a JVM (`lakehouse.engines.arrow`), each a
package of its own that never imports the other (an import-linter contract), and the choice
between them (`lakehouse.engines.choice`).

`Engine` is what the service and the orchestrators talk to. An engine

* reads a step's input as batches of its own frames (`batches`): a Spark DataFrame, or a
  `pyarrow.Table`;
* conforms a frame to a table's schema (`conform`), in the platform's one type model: Arrow
  schemas, mapped to the tables' Iceberg schemas by `lakehouse.engines.types` (Spark's types are
  converted at the Spark engine's edge);
* evaluates the rules: `tag_failures` adds `_failed_rules` (the row rules each row fails),
  `evaluate` gives every rule's `CheckOutcome` (messages and counting shared in
  lakehouse.validation.rules);
* writes to the run's audit branch and to the quarantine table's branch through a write session
  (`session`, a `lakehouse.engines.audited.BranchWrite`: the engine-neutral branch bookkeeping and
  exactly-once publish, with the engine's `write` and `audit`), on the engine's tables handle
  (`tables`).

A row rule kind (and freshness) is written once, as a sqlglot predicate in Spark SQL's semantics
(lakehouse.validation.predicates) that Spark evaluates as Spark SQL and the Arrow engine as DuckDB
SQL; outcomes and messages are shared code (lakehouse.validation.rules); what the engines count
their own way (unique, the Spark engine's statistics-answered counts) is said where it is.
tests/test_engine_parity.py runs every rule kind through both engines' `tag_failures` and
`evaluate` on the same rows. The idea is
SQLMesh's engine adapters (one base the core talks to, a subclass per engine), without promising
identical results where the engines differ: what the Arrow engine cannot answer as Spark does is
refused when the metadata is validated (lakehouse.metadata.engine_support) and chosen away from
at run time (lakehouse.engines.choice).

`engine_for` gives the engine object of a choice; an engine package is imported only when it is
chosen, so a run on the Arrow engine never imports Spark's write path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

    from lakehouse.engines.audited import BranchWrite
    from lakehouse.engines.choice import EngineChoice
    from lakehouse.metadata.model import Rule
    from lakehouse.platform import Platform
    from lakehouse.stage.core import Batch, ExtractPlan, StageContext
    from lakehouse.table.iceberg import CatalogTables
    from lakehouse.validation.rules import CheckOutcome


@runtime_checkable
class Engine(Protocol):
    """One write engine (see the module docstring). `Frame` below is the engine's own frame type:
    `pyspark.sql.DataFrame` on Spark, `pyarrow.Table` on Arrow (`lakehouse.stage.core.Frame`)."""

    name: str

    def tables(self, platform: Platform) -> CatalogTables:
        """The platform's tables, with writes and branch operations done by this engine."""
        ...

    def session(self, ctx: StageContext, tables: CatalogTables, branch: str, **kwargs: Any) -> BranchWrite:
        """A write session on `branch` of the step's target (and of its quarantine table)."""
        ...

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        """The planned input, one batch per commit, each holding a frame of this engine."""
        ...

    def conform(self, frame: Any, schema: pa.Schema) -> Any:
        """`frame` as exactly `schema`: columns matched by name case-insensitively, cast (nested
        fields too), NULL for columns it lacks, in the schema's order."""
        ...

    def tag_failures(self, frame: Any, rules: list[Rule], errors: dict[str, str], time_zone: str = "UTC") -> Any:
        """`frame` with `_failed_rules`: the names of every enabled row rule the row fails (NULL
        fails); a rule that cannot be evaluated tags nothing and its error goes to `errors`."""
        ...

    def evaluate(self, frame: Any, rules: list[Rule], context: dict[str, Any]) -> list[CheckOutcome]:
        """Every enabled rule's outcome on `frame` (the rows a run adds); `context` as
        `lakehouse.validation.rules.evaluate_rules` takes it."""
        ...


def engine_for(choice: EngineChoice | str) -> Engine:
    """The engine object of a choice (`spark` or `arrow`)."""
    from lakehouse.engines.choice import EngineChoice

    name = choice.engine if isinstance(choice, EngineChoice) else choice
    if name == "arrow":
        from lakehouse.engines.arrow import ArrowEngine

        return ArrowEngine()
    from lakehouse.engines.spark import SparkEngine

    return SparkEngine()
