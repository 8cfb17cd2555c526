"""One stage as a sequence of values: `StageRequest` → `StagePlan` → `StagedWrite` → `PublishResult`.

`values` holds the frozen values (a `StagedWrite` round-trips through JSON: the Dagster IO manager
stores it and publishes from it); `steps` the three steps, each a function of the value before it,
each running its work once through `lakehouse.control.attempt.attempt`, the one wrapper that applies
the step's deadline, healing and retry policy on the step's one attempt budget. `lakehouse.stage.runner.StageRunner` is a facade over `steps`.
"""
