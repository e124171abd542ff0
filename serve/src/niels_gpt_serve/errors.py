"""Every error the API answers, as one JSON shape, and the request-size limit.

An error body is ``{"detail": "<field>: <message>", "field": "<field>",
"errors": [{"field", "message", "type"}, ...]}``: ``field`` is the request
field at fault (``"body"`` for the body as a whole), so a client can point at
it. Statuses: 400 a body that is not JSON, 413 a body over the limit, 422 a
field that is missing, of the wrong type or out of range, 404 an unknown
path, 405 a wrong method, 503 too many requests waiting.

Under ``/v1/`` (the OpenAI-compatible API) the same errors take that
protocol's shape: ``{"error": {"message", "type", "param", "code"}}``,
``param`` the field, ``type`` ``invalid_request_error`` for a 4xx and
``server_error`` for a 5xx; and a field error is a 400 there, not a 422, as
OpenAI and vLLM answer it (so the ``openai`` client raises ``BadRequestError``).
An unexpected error is a JSON 500 in either shape (``metrics.RequestIds``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from niels_gpt_serve.limits import FieldError

__all__ = ["BodyLimit", "error_body", "error_response", "install_handlers", "openai_error"]


def error_body(field: str, message: str, kind: str, more: Sequence[dict[str, str]] = ()) -> Any:
    """The JSON error body (see the module docstring)."""
    first = {"field": field, "message": message, "type": kind}
    return {"detail": f"{field}: {message}", "field": field, "errors": [first, *more]}


def openai_error(status: int, field: str | None, message: str, code: str) -> Any:
    """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    text = f"{field}: {message}" if field else message
    return {"error": {"message": text, "type": kind, "param": field, "code": code}}


def error_response(
    path: str,
    status: int,
    field: str,
    message: str,
    kind: str,
    more: Sequence[dict[str, str]] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The error in the shape of the API ``path`` belongs to (``/v1/``: OpenAI's, a 422
    answered as 400)."""
    if path.startswith("/v1/"):
        status = 400 if status == 422 else status
        return JSONResponse(openai_error(status, field, message, kind), status, headers=headers)
    return JSONResponse(error_body(field, message, kind, more), status, headers=headers)


def _field(loc: Sequence[int | str]) -> str:
    """``("body", "top_k")`` -> ``"top_k"``; ``("body",)`` -> ``"body"``."""
    parts = [str(p) for p in loc[1:]] if loc and loc[0] == "body" else [str(p) for p in loc]
    return ".".join(parts) or "body"


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "field": _field(e.get("loc", ())),
            # pydantic words a validator's ValueError "Value error, <its text>": the text only
            "message": str(e.get("msg", "")).removeprefix("Value error, "),
            "type": e["type"],
        }
        for e in exc.errors()
    ]
    path = request.url.path
    if any(e["type"] == "json_invalid" for e in errors):
        message = "must be a JSON object (it is not valid JSON)"
        return error_response(path, 400, "body", message, "json_invalid")
    first = errors[0] if errors else {"field": "body", "message": "invalid", "type": "invalid"}
    return error_response(path, 422, first["field"], first["message"], first["type"], errors[1:])


def _field_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return error_response(request.url.path, exc.status, exc.field, exc.message, exc.code)


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    # 400: the body could not be parsed (not UTF-8); 404, 405: the path or its method.
    field = "body" if exc.status_code == 400 else "path"
    return error_response(
        request.url.path, exc.status_code, field, str(exc.detail), f"http_{exc.status_code}",
        headers=exc.headers,
    )  # fmt: skip


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

    async def _refuse(self, send: Send, size: str, path: str) -> None:
        message = f"must be at most {self.max_bytes} bytes, got {size}"
        if path.startswith("/v1/"):
            body = openai_error(413, "body", message, "too_large")
        else:
            body = error_body("body", message, "too_large")
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
            await self._refuse(send, f"{int(declared)} (Content-Length)", scope["path"])
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
                await self._refuse(send, f"more than that ({size} so far)", scope["path"])
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
