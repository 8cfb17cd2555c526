"""`lakehouse settings reference [--write README.md]` and `lakehouse settings show`: the platform's
environment variables (lakehouse.settings.PlatformSettings) as README.md's table, and as this
environment sets them (secrets masked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lakehouse.cli.app import EXTRA_COMMANDS


def cmd_settings(args) -> int:
    from lakehouse import settings as model

    if args.action == "reference":
        if args.write:
            path = Path(args.write)
            try:
                path.write_text(model.replace_table(path.read_text()))
            except ValueError as exc:
                print(f"error: {path}: {exc}", file=sys.stderr)
                return 2
            print(f"wrote the settings table into {path}")
        else:
            print(model.render_table(), end="")
        return 0
    current = model.load_settings()
    shown = json.loads(current.model_dump_json())  # SecretStr fields print as '**********'
    shown["control_db_url"] = _without_password(current.control_db_url)
    print(json.dumps({model.env_name(k): v for k, v in shown.items()}, indent=2, default=str))
    return 0


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy parses: show only its scheme
        return url.split(":", 1)[0] + ":..."


def register(sub) -> None:
    s = sub.add_parser("settings", help="the environment variables the platform reads (lakehouse.settings)")
    ssub = s.add_subparsers(dest="action", required=True)
    r = ssub.add_parser("reference", help="print README.md's table of every variable (generated from the model)")
    r.add_argument("--write", metavar="README", help="replace the table between the <!-- settings --> markers "
                                                     "of this file instead")
    ssub.add_parser("show", help="every setting as this environment sets it (secrets masked)")
    s.set_defaults(func=cmd_settings)


EXTRA_COMMANDS.append(register)
