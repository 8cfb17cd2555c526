"""The entity_raw load service (seed 000): connectors in any language load raw extraction files
over HTTP. `jobs` keeps load jobs in the control DB, `runs` submits and observes them as Dagster
runs, `app` is the FastAPI application `lakehouse serve` starts with uvicorn."""
