"""`lakehouse serve [--host H] [--port P]`: the entity_raw load API (FastAPI on uvicorn).
`lakehouse serve token add|rotate|revoke|list`: its per-tenant bearer tokens.

Needs a per-tenant token (`lakehouse serve token add --tenant T --applications a,b`) or the
operator's shared LAKEHOUSE_API_TOKEN (it acts for every tenant). Loads are runs of the
Dagster instance of DAGSTER_HOME (default $LAKEHOUSE_HOME/dagster_home, the one `lakehouse run`,
the UI and the daemon share); its run coordinator queues them, so a dagster-daemon must be running.
The code location comes from --workspace (default ./workspace.yaml).
"""

from __future__ import annotations

import logging
import os
import sys

from lakehouse.cli.app import EXTRA_COMMANDS

TOKEN_ENV = "LAKEHOUSE_API_TOKEN"


def cmd_serve(args) -> int:
    from lakehouse.settings import load_settings

    if getattr(args, "token_command", None):
        return args.token_func(args)
    settings = load_settings()  # the service's one read of the environment
    token = settings.api_token.get_secret_value() if settings.api_token is not None else ""
    if not token:
        from lakehouse.platform import Platform
        from lakehouse.service import tokens

        if not tokens.any_valid(Platform.from_settings(settings).store):
            print(f"error: no token could use the load API: add one per tenant (`lakehouse serve token add "
                  f"--tenant T --applications a,b`) or set {TOKEN_ENV}; the load API never runs open",
                  file=sys.stderr)
            return 2
    if not os.path.isfile(args.workspace):
        print(f"error: no workspace file {args.workspace}", file=sys.stderr)
        return 2
    import uvicorn

    from lakehouse.orchestration.gateway import RunGateway
    from lakehouse.orchestration.instance import ensure_instance
    from lakehouse.platform import Platform
    from lakehouse.service.app import create_app

    service_log = logging.getLogger("lakehouse.service")  # accepted loads and their correlation ids
    if not service_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        service_log.addHandler(handler)
        service_log.setLevel(logging.INFO)
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
    s.set_defaults(func=cmd_serve, token_command=None)
    tok = s.add_subparsers(dest="token_group", metavar="token")
    t = tok.add_parser("token", help="per-tenant bearer tokens (stored hashed in the control DB)")
    ts = t.add_subparsers(dest="token_command", required=True)
    a = ts.add_parser("add", help="a new token for one tenant and a set of applications; printed once")
    a.add_argument("--tenant", required=True)
    a.add_argument("--applications", required=True, help="comma-separated application ids, or `*` for all")
    a.add_argument("--label", default=None)
    a.set_defaults(token_func=_token_add)
    r = ts.add_parser("rotate", help="a new token with the scope of TOKEN_ID; both stay valid until you revoke "
                                     "the old one")
    r.add_argument("token_id")
    r.set_defaults(token_func=_token_rotate)
    v = ts.add_parser("revoke", help="refuse TOKEN_ID from now on")
    v.add_argument("token_id")
    v.set_defaults(token_func=_token_revoke)
    ls = ts.add_parser("list", help="tokens (never their secrets)")
    ls.add_argument("--tenant", default=None)
    ls.set_defaults(token_func=_token_list)


def _store():
    from lakehouse.platform import Platform
    from lakehouse.settings import load_settings

    return Platform.from_settings(load_settings()).store


def _token_add(args) -> int:
    from lakehouse.service import tokens

    try:
        token_id, token = tokens.add(_store(), args.tenant, args.applications.split(","), label=args.label)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"token_id: {token_id}\ntoken: {token}\n(shown once: only its hash is kept)")
    return 0


def _token_rotate(args) -> int:
    from lakehouse.service import tokens

    try:
        token_id, token = tokens.rotate(_store(), args.token_id)
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"token_id: {token_id}\ntoken: {token}\n(shown once; {args.token_id} stays valid until "
          f"`lakehouse serve token revoke {args.token_id}`)")
    return 0


def _token_revoke(args) -> int:
    from lakehouse.service import tokens

    if not tokens.revoke(_store(), args.token_id):
        print(f"error: no valid token {args.token_id!r}", file=sys.stderr)
        return 2
    print(f"revoked {args.token_id}")
    return 0


def _token_list(args) -> int:
    from lakehouse.service import tokens

    for row in tokens.listing(_store(), args.tenant):
        state = f"revoked {row['revoked_at']:%Y-%m-%d %H:%M}" if row["revoked_at"] else "valid"
        print(f"{row['token_id']}  tenant={row['tenant_id']}  applications={','.join(row['applications'])}  "
              f"{state}" + (f"  replaces={row['replaces']}" if row["replaces"] else "")
              + (f"  label={row['label']}" if row["label"] else ""))
    return 0


def cmd_load_submit(args) -> int:
    import json

    from lakehouse.service.client import LoadFailed, submit_and_poll

    if not args.pattern and not args.file_key:
        print("error: give --pattern and/or --file-key", file=sys.stderr)
        return 2
    try:
        out = submit_and_poll(application=args.application, patterns=args.pattern or [],
                              file_keys=args.file_key or [], tenant_id=args.tenant, wait=args.wait,
                              require_enabled=False)
    except (LoadFailed, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, default=str))
    return 0


def register_load(sub) -> None:
    p = sub.add_parser("load", help="the load API's client (seed 000): submit a load, optionally wait for it")
    lsub = p.add_subparsers(dest="load_command", required=True)
    s = lsub.add_parser("submit", help="POST /load to MDLH_BASE_URL; --wait polls until COMPLETED or FAILED")
    s.add_argument("--application", default=None, help="the raw table (default LH_LOAD_RAW_TABLE_NAME)")
    s.add_argument("--pattern", action="append", help="a glob over keys (repeatable)")
    s.add_argument("--file-key", action="append", help="an object key (repeatable)")
    s.add_argument("--tenant", default=None, help="X-Atlan-Tenant-Id (default LH_LOAD_TENANT_ID)")
    s.add_argument("--wait", action="store_true", help="poll every LH_LOAD_POLL_INTERVAL_SECONDS until done")
    s.set_defaults(func=cmd_load_submit)


EXTRA_COMMANDS.append(register)
EXTRA_COMMANDS.append(register_load)
