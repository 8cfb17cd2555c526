"""What the load API checks before any route runs: the bearer token, then the body's size.

A pure ASGI middleware, so nothing of a request is read or parsed before it is authenticated: a
request without a valid token is answered 401 from its headers alone (its body is never read), a
body declared larger than the limit is answered 413 the same way, and a body without a declared
length is read only up to the limit. Liveness paths answer without a token (the route then says
only the status); with a token they may say more. The principal a token stands for goes to the
routes as `request.state.principal` (lakehouse.service.tokens.Principal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from lakehouse.service.tokens import Principal

#: answered without a token (status only)
LIVENESS = frozenset({"/health", "/actuator/health"})


def unauthorized() -> JSONResponse:
    return JSONResponse({"detail": "missing or invalid bearer token"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


class Gate:
    def __init__(self, app: Any, authenticate: Callable[[str], Principal | None], max_body_bytes: int):
        self.app = app
        self.authenticate = authenticate
        self.max_body = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.lower(), v)
        auth = headers.get(b"authorization", b"").decode("latin-1").strip()
        principal: Principal | None = None
        if auth:
            scheme, _, credential = auth.partition(" ")
            credential = credential.strip()
            if scheme.lower() == "bearer" and credential and len(credential) <= 512:
                principal = await run_in_threadpool(self.authenticate, credential)
            if principal is None:
                await unauthorized()(scope, receive, send)
                return
        elif scope["path"] not in LIVENESS:
            await unauthorized()(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal

        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await JSONResponse({"detail": "invalid Content-Length"}, status_code=400)(scope, receive, send)
                return
            if size > self.max_body:
                await self._too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        total = 0
        while True:  # at most max_body bytes are ever held
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_body:
                await self._too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        buffered = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": buffered, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: dict, receive: Callable, send: Callable) -> None:
        await JSONResponse({"detail": f"request body over the limit of {self.max_body} bytes "
                                      "(setting LAKEHOUSE_API_MAX_BODY_BYTES)"},
                           status_code=413, headers={"Connection": "close"})(scope, receive, send)
