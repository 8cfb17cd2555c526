"""`lakehouse serve [--host H] [--port P]`: the entity_raw load API (FastAPI on uvicorn).

Needs LAKEHOUSE_API_TOKEN (the bearer token every request must carry). Loads are runs of the
Dagster instance of DAGSTER_HOME (default $LAKEHOUSE_HOME/dagster_home, the one `lakehouse run`,
the UI and the daemon share); its run coordinator queues them, so a dagster-daemon must be running.
The code location comes from --workspace (default ./workspace.yaml).
"""

from __future__ import annotations

import os
import sys

from lakehouse.cli import EXTRA_COMMANDS

TOKEN_ENV = "LAKEHOUSE_API_TOKEN"


def cmd_serve(args) -> int:
    from lakehouse.settings import load_settings

    settings = load_settings()  # the service's one read of the environment
    token = settings.api_token.get_secret_value() if settings.api_token is not None else ""
    if not token:
        print(f"error: set {TOKEN_ENV} to the bearer token clients must send; the load API never runs open",
              file=sys.stderr)
        return 2
    if not os.path.isfile(args.workspace):
        print(f"error: no workspace file {args.workspace}", file=sys.stderr)
        return 2
    import uvicorn

    from lakehouse.platform import Platform
    from lakehouse.service.app import create_app
    from lakehouse.service.runs import RunGateway
    from lakehouse.throughput.instance import ensure_instance

    platform = Platform.from_settings(settings)
    _home, instance = ensure_instance(platform.settings)  # the instance `lakehouse run`, the UI and the daemon share
    gateway = RunGateway(args.workspace, args.location, instance=instance)
    gateway.start()  # the code location loads before the first request
    try:
        app = create_app(platform, gateway, token)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    finally:
        gateway.close()
    return 0


def register(sub) -> None:
    s = sub.add_parser("serve", help="the entity_raw load API: POST /load, GET /load/{id}, GET /health")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8600)
    s.add_argument("--workspace", default="workspace.yaml", help="Dagster workspace file of the code location")
    s.add_argument("--location", default="lakehouse", help="code location name in the workspace")
    s.add_argument("--log-level", default="info")
    s.add_argument("--access-log", action="store_true", help="log every request")
    s.set_defaults(func=cmd_serve)


EXTRA_COMMANDS.append(register)
