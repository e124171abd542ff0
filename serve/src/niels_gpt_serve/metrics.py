"""Prometheus metrics (``GET /metrics``) and request ids, as one ASGI middleware.

Every app has its own ``CollectorRegistry`` (tests build several in one
process). Names::

    niels_serve_requests_total{route, status}     answered HTTP requests
    niels_serve_tokens_total{kind}                prompt and completion tokens
    niels_serve_queue_depth                       requests waiting for a slot
    niels_serve_running                           requests in the running batch
    niels_serve_batch_size                        histogram: rows of each decode step
    niels_serve_time_to_first_token_seconds       histogram: arrival to first token
    niels_serve_time_per_token_seconds            histogram: between two tokens of a request

An exception no handler answered is logged with its traceback and answered
here with a JSON 500 (the error shape of its API), counted as ``status="500"``,
so the keep-alive connection stays usable; once an answer has begun, the
exception goes on to the server, which closes that connection.

``X-Request-Id``: a client's id (1 to 128 visible ASCII characters) is kept,
otherwise one is made; either way the response carries it back.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from niels_gpt_serve.errors import error_body, openai_error

__all__ = ["Metrics", "RequestIds"]

_ID = re.compile(rb"[\x21-\x7e]{1,128}")
_ROUTES = {
    "/", "/api/model", "/api/health", "/api/generate", "/api/generate/stream", "/api/attention",
    "/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics",
}  # fmt: skip
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The app's metrics; ``stats`` is the batcher's ``stats`` (read at each scrape)."""

    def __init__(self, stats: Callable[[], dict[str, int]]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "niels_serve_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.tokens = Counter("niels_serve_tokens", "Tokens by kind", ["kind"], registry=r)
        queue = Gauge("niels_serve_queue_depth", "Requests waiting for a slot", registry=r)
        queue.set_function(lambda: stats()["waiting"])
        running = Gauge("niels_serve_running", "Requests in the running batch", registry=r)
        running.set_function(lambda: stats()["running"])
        self.batch = Histogram(
            "niels_serve_batch_size", "Rows of each decode step",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "niels_serve_time_to_first_token_seconds", "Arrival to first token",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.per_token = Histogram(
            "niels_serve_time_per_token_seconds", "Time between two tokens of a request",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


_log = logging.getLogger("niels_serve")


async def _answer_500(path: str, send: Send) -> None:
    message = "the server failed to answer this request (its log has the traceback)"
    if path.startswith("/v1/"):
        body = openai_error(500, None, message, "internal_error")
    else:
        body = error_body("body", message, "internal_error")
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class RequestIds:
    """ASGI middleware: ``X-Request-Id`` in and out, and ``niels_serve_requests_total``."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"")
        rid = given.decode() if _ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        status = ["none"]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if status[0] != "none":
                raise  # the answer has begun: the server closes the connection
            _log.exception("niels-serve: %s %s failed", scope["method"], scope["path"])
            await _answer_500(scope["path"], send_with_id)
        finally:
            route = scope["path"] if scope["path"] in _ROUTES else "other"
            self.metrics.requests.labels(route, status[0]).inc()
