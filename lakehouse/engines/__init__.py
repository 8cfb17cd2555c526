"""The write engines: Spark (`lakehouse.engines.spark`) and PyIceberg + Arrow without a JVM
(`lakehouse.engines.arrow`), and the choice between them (`lakehouse.engines.choice`).

`engine_for` gives the engine object of a choice; each engine package is imported only when it is
chosen, so a run on the Arrow engine never imports Spark's write path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lakehouse.engines.choice import EngineChoice


def engine_for(choice: EngineChoice | str):
    """The engine object of a choice (`spark` or `arrow`)."""
    from lakehouse.engines.choice import EngineChoice

    name = choice.engine if isinstance(choice, EngineChoice) else choice
    if name == "arrow":
        from lakehouse.engines.arrow import ArrowEngine

        return ArrowEngine()
    from lakehouse.engines.spark import SparkEngine

    return SparkEngine()
