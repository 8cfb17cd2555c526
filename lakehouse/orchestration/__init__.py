"""Dagster infrastructure the domain calls: the Dagster instance (`instance`), its run queue
(`queue`) and pools (`pools`), a run's failures (`runs`), the kill switch's enforcement on runs
(`killswitch`) and the load service's run gateway (`gateway`). With the modules pyproject's
`domain-without-dagster` contract lists, the only part of `lakehouse` that imports Dagster
(docs/ARCHITECTURE.md, Layers)."""
