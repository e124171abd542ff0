"""Every error the API answers, as one JSON shape, and the request-size limit.

An error body is ``{"detail": "<field>: <message>", "field": "<field>",
"errors": [{"field", "message", "type"}, ...]}``: ``field`` is the request
field at fault (``"body"`` for the body as a whole), so a client can point at
it. Statuses: 400 a body that is not JSON, 413 a body over the limit, 422 a
field that is missing, of the wrong type or out of range, 404 an unknown
path, 405 a wrong method, 503 too many requests waiting.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from niels_gpt_serve.limits import FieldError

__all__ = ["BodyLimit", "error_body", "install_handlers"]


def error_body(field: str, message: str, kind: str, more: Sequence[dict[str, str]] = ()) -> Any:
    """The JSON error body (see the module docstring)."""
    first = {"field": field, "message": message, "type": kind}
    return {"detail": f"{field}: {message}", "field": field, "errors": [first, *more]}


def _field(loc: Sequence[int | str]) -> str:
    """``("body", "top_k")`` -> ``"top_k"``; ``("body",)`` -> ``"body"``."""
    parts = [str(p) for p in loc[1:]] if loc and loc[0] == "body" else [str(p) for p in loc]
    return ".".join(parts) or "body"


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"field": _field(e.get("loc", ())), "message": str(e.get("msg", "")), "type": e["type"]}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return JSONResponse(
            error_body("body", "must be a JSON object (it is not valid JSON)", "json_invalid"), 400
        )
    first = errors[0] if errors else {"field": "body", "message": "invalid", "type": "invalid"}
    return JSONResponse(
        error_body(first["field"], first["message"], first["type"], errors[1:]), 422
    )


def _field_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return JSONResponse(error_body(exc.field, exc.message, "limit"), exc.status)


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    # 400: the body could not be parsed (not UTF-8); 404, 405: the path or its method.
    field = "body" if exc.status_code == 400 else "path"
    return JSONResponse(
        error_body(field, str(exc.detail), f"http_{exc.status_code}"),
        exc.status_code,
        headers=exc.headers,
    )


def install_handlers(app: FastAPI) -> None:
    """Answer validation, limit and HTTP errors with the JSON error body."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(FieldError, _field_error)
    app.add_exception_handler(StarletteHTTPException, _http)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets a 413 JSON error
    before the app reads any of it (by ``Content-Length``, or while it streams in)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _refuse(self, send: Send, size: str) -> None:
        body = error_body(
            "body", f"must be at most {self.max_bytes} bytes, got {size}", "too_large"
        )
        data = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"{int(declared)} (Content-Length)")
            return
        # Read the whole (bounded) body first, then hand it to the app as one message.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, f"more than that ({size} so far)")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
