"""Stages computed by a Python function (`transformation: {python: package.module:function, inputs: [...]}`).

The function is called with one argument, a mapping of table identifier -> Spark DataFrame of each
of its `inputs` at the snapshot the run pinned, and returns one DataFrame: the stage's table. It is
written like any other stage's input (one batch through the write-audit-publish service, the
stage's rules as asset checks). Its output columns are known only once it has run: static checks
validate the reference (importable, callable, one positional argument), not the columns.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConfigurationError
from lakehouse.metadata.python_ref import reference_problem
from lakehouse.sources.base import SourceAdapter, register
from lakehouse.stage.core import PYTHON, Batch, ExtractPlan, StageContext
from lakehouse.stage.pins import pin_upstream, upstream_frames

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform


def resolve(ref: str) -> Callable[[dict[str, Any]], Any]:
    problem = reference_problem(ref)
    if problem:
        raise ConfigurationError(f"python transformation {ref}: {problem}")
    module_name, _, name = ref.partition(":")
    return getattr(importlib.import_module(module_name), name)


@register
class PythonAdapter(SourceAdapter):
    kind = PYTHON

    def plan(self, ctx: StageContext, src: Source | None, plan: ExtractPlan) -> None:
        pin_upstream(ctx, plan, list(ctx.stage.python_transformation.inputs))

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        from pyspark.sql import DataFrame

        spec = ctx.stage.python_transformation
        out = resolve(spec.function)(upstream_frames(ctx, plan))
        if not isinstance(out, DataFrame):
            raise ConfigurationError(f"stage {ctx.stage.pipeline_id}.{ctx.stage.stage_name}: {spec.function} returned "
                                     f"a {type(out).__name__}, not a Spark DataFrame")
        yield Batch(out, {"lakehouse.upstream": json.dumps(plan.upstream_snapshots, separators=(",", ":"))},
                    label="python")

    def probe(self, platform: Platform, src: Source | None) -> tuple[bool, str]:
        return True, "reads Iceberg tables; each input is pinned when the stage is planned"
