"""Per-tenant bearer tokens of the load API, kept hashed in the control DB (table api_tokens).

A token is `lht_<token_id>_<secret>`: the id is public (it names the token in `lakehouse serve
token list` and in logs), the secret is 256 random bits of which only the SHA-256 is stored (a
random secret needs no slow hash: nothing can be guessed from its digest). A token belongs to one
tenant and a set of applications (`*`: all of that tenant's). Rotation adds a new token with the
same scope while the old one stays valid, so clients can move over; revoking the old one ends
the overlap. Plain functions over the control DB; no FastAPI.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from lakehouse.metadata.schema import api_tokens
from lakehouse.metadata.store import MetadataStore

PREFIX = "lht_"
_TOKEN = re.compile(r"^lht_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")
ALL = "*"


@dataclass(frozen=True)
class Principal:
    """Who a request acts for. `tenant_id is None`: the operator's shared token (every tenant)."""

    token_id: str
    tenant_id: str | None
    applications: frozenset[str] | None  # None: every application

    def may_use(self, application: str) -> bool:
        return self.applications is None or application.lower() in self.applications

    def may_act_for(self, tenant: str) -> bool:
        return self.tenant_id is None or self.tenant_id == tenant


OPERATOR = Principal("shared", None, None)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def _apps(applications: list[str] | tuple[str, ...]) -> list[str]:
    names = sorted({a.strip().lower() for a in applications if a.strip()})
    if not names:
        raise ValueError("a token needs at least one application (or `*` for all of the tenant's)")
    return [ALL] if ALL in names else names


def add(store: MetadataStore, tenant_id: str, applications: list[str] | tuple[str, ...], *,
        label: str | None = None, replaces: str | None = None) -> tuple[str, str]:
    """(token_id, token): the token is shown once; only its hash is stored."""
    if not tenant_id or not tenant_id.strip():
        raise ValueError("a token needs a tenant")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    store.create_all()
    with store.engine.begin() as conn:
        conn.execute(sa.insert(api_tokens).values(
            token_id=token_id, tenant_id=tenant_id.strip(), applications=json.dumps(_apps(applications)),
            token_hash=_digest(secret), label=label, replaces=replaces, created_at=_now()))
    return token_id, f"{PREFIX}{token_id}_{secret}"


def _row(store: MetadataStore, token_id: str) -> dict[str, Any] | None:
    store.create_all()
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(api_tokens).where(api_tokens.c.token_id == token_id)).mappings().first()
    return dict(row) if row is not None else None


def rotate(store: MetadataStore, token_id: str, *, label: str | None = None) -> tuple[str, str]:
    """A new token with the scope of `token_id`, which stays valid until it is revoked."""
    old = _row(store, token_id)
    if old is None or old["revoked_at"] is not None:
        raise LookupError(f"no valid token {token_id!r} to rotate")
    return add(store, old["tenant_id"], json.loads(old["applications"]), label=label or old["label"],
               replaces=token_id)


def revoke(store: MetadataStore, token_id: str) -> bool:
    """True if a valid token was revoked (it is refused from the next request on)."""
    store.create_all()
    with store.engine.begin() as conn:
        n = conn.execute(sa.update(api_tokens).where(api_tokens.c.token_id == token_id,
                                                     api_tokens.c.revoked_at.is_(None))
                         .values(revoked_at=_now())).rowcount
    return bool(n)


def listing(store: MetadataStore, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Every token without its hash."""
    store.create_all()
    q = sa.select(api_tokens.c.token_id, api_tokens.c.tenant_id, api_tokens.c.applications, api_tokens.c.label,
                  api_tokens.c.replaces, api_tokens.c.created_at, api_tokens.c.revoked_at)
    if tenant_id is not None:
        q = q.where(api_tokens.c.tenant_id == tenant_id)
    with store.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(q.order_by(api_tokens.c.tenant_id, api_tokens.c.created_at)).mappings()]
    for r in rows:
        r["applications"] = json.loads(r["applications"])
    return rows


def any_valid(store: MetadataStore) -> bool:
    store.create_all()
    with store.engine.connect() as conn:
        return conn.execute(sa.select(api_tokens.c.token_id).where(api_tokens.c.revoked_at.is_(None)).limit(1)
                            ).first() is not None


def verify(store: MetadataStore, token: str, shared: str = "") -> Principal | None:
    """The principal of a presented token, or None (unknown, malformed, revoked or wrong secret)."""
    if shared and hmac.compare_digest(token.encode(), shared.encode()):
        return OPERATOR
    m = _TOKEN.match(token)
    if m is None:
        return None
    row = _row(store, m.group(1))
    if row is None or row["revoked_at"] is not None:
        return None
    if not hmac.compare_digest(_digest(m.group(2)), row["token_hash"]):
        return None
    apps = json.loads(row["applications"])
    return Principal(row["token_id"], row["tenant_id"], None if ALL in apps else frozenset(apps))
