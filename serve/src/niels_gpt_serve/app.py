"""The FastAPI app: the page, the generation API (JSON and server-sent events), attention.

Routes (OpenAPI schema at ``/openapi.json``; no ``/docs``: Swagger UI needs a CDN)::

    GET  /                      the page (and /app.js, /heads.js, /style.css beside it)
    GET  /api/model             what is served and the limits of a request
    GET  /api/health            "ok" and the batcher's counters
    POST /api/generate          one JSON answer when the generation is done
    POST /api/generate/stream   the same as server-sent events, a token at a time
    POST /api/attention         every layer's and head's attention over a token sequence
    GET  /metrics               Prometheus metrics (``metrics.py``)
    GET  /v1/models, POST /v1/completions, POST /v1/chat/completions
                                the OpenAI-compatible API (``openai_api.py``)

No route reads a file path from a request: the page's three files are read
from the package once, when the app is built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_serve import __version__
from niels_gpt_serve.batcher import Batcher, Busy, Done, Failed, Token
from niels_gpt_serve.cached import CachedEngine
from niels_gpt_serve.engine import Engine, PaddedEngine, attention_maps
from niels_gpt_serve.errors import BodyLimit, error_body, error_response, install_handlers
from niels_gpt_serve.generation import Generation, until_disconnected
from niels_gpt_serve.limits import Limits, check_attention, check_generate
from niels_gpt_serve.metrics import Metrics, RequestIds
from niels_gpt_serve.openai_api import install_openai
from niels_gpt_serve.schemas import (
    AttentionRequest,
    AttentionResponse,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    TrainingInfo,
)
from niels_gpt_serve.tokens import byte_label, labels
from niels_gpt_serve.trained import Training

__all__ = ["ENGINES", "Served", "create_app"]

#: The engines ``niels-serve --engine`` offers, by name.
ENGINES: dict[str, Callable[[GPT], Engine]] = {"cached": CachedEngine, "padded": PaddedEngine}

_PAGE_FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "heads.js": "text/javascript",
    "style.css": "text/css",
}


@dataclass(frozen=True)
class Served:
    """The model being served, where it came from and how trained it is
    (``training`` None: nothing known beyond ``step``)."""

    model: GPT
    config: ModelConfig
    arch: str
    run: str
    step: int
    training: Training | None = None


def _training_info(served: Served) -> TrainingInfo:
    known = served.training or Training(step=served.step)
    return TrainingInfo(
        steps=known.steps,
        val_loss=known.val_loss,
        val_step=known.val_step,
        tokens=known.tokens,
        barely_trained=known.barely_trained,
        summary=known.summary(),
    )


def _page_files() -> dict[str, bytes]:
    static = resources.files("niels_gpt_serve") / "static"
    return {name: (static / name).read_bytes() for name in _PAGE_FILES}


def _sse(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def create_app(
    served: Served, limits: Limits | None = None, engine: Engine | None = None
) -> FastAPI:
    """The app for ``served``; its batcher starts and stops with the app's lifespan."""
    limits = limits or Limits()
    cfg = served.config
    batcher = Batcher(
        engine or CachedEngine(served.model),
        max_batch=limits.max_batch,
        max_waiting=limits.max_waiting,
    )
    metrics = Metrics(batcher.stats)
    batcher.on_step = metrics.batch.observe
    page = _page_files()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            batcher.close()
            batcher.engine.close()

    app = FastAPI(
        title="niels-serve",
        version=__version__,
        summary="Generate text with a niels_gpt model and see its attention.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc load from a CDN: blank offline, so not served
        redoc_url=None,
    )
    app.state.batcher = batcher
    install_handlers(app)

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Exception) -> JSONResponse:
        headers = {"Retry-After": "1"}
        return error_response(request.url.path, 503, "body", str(exc), "busy", headers=headers)

    @app.exception_handler(GenerationFailed)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request.url.path, 500, "body", str(exc), "failed")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> Response:
        return Response(page["index.html"], media_type=_PAGE_FILES["index.html"])

    @app.get("/app.js", include_in_schema=False)
    async def script() -> Response:
        return Response(page["app.js"], media_type=_PAGE_FILES["app.js"])

    @app.get("/heads.js", include_in_schema=False)
    async def heads_script() -> Response:
        return Response(page["heads.js"], media_type=_PAGE_FILES["heads.js"])

    @app.get("/style.css", include_in_schema=False)
    async def style() -> Response:
        return Response(page["style.css"], media_type=_PAGE_FILES["style.css"])

    @app.get("/api/model")
    async def model_info() -> ModelInfo:
        """The served model, its sizes and the limits of a request."""
        return ModelInfo(
            arch=served.arch,
            run=served.run,
            step=served.step,
            params=sum(p.numel() for p in served.model.parameters()),
            V=cfg.V, T=cfg.T, C=cfg.C, L=cfg.L, H=cfg.H, H_kv=cfg.kv_heads, d_ff=cfg.d_ff,
            engine=batcher.engine.name,
            training=_training_info(served),
            max_new_tokens=min(limits.max_new_tokens, cfg.T - 1),
            max_prompt_tokens=cfg.T - 1,
            max_batch=limits.max_batch,
            max_body_bytes=limits.max_body_bytes,
        )  # fmt: skip

    @app.get("/api/health")
    async def health() -> dict[str, int | str]:
        """``status: ok`` and the batcher's counters (running, waiting, served, cancelled...)."""
        return {"status": "ok", **batcher.stats()}

    @app.post("/api/generate", response_model=GenerateResponse)
    async def generate(req: GenerateRequest, request: Request) -> GenerateResponse | Response:
        """Generate, and answer once every token is there."""
        run = Generation(batcher, req, check_generate(req, cfg, limits), metrics)
        try:
            return await until_disconnected(_collect(run), request, [run])
        except asyncio.CancelledError:
            return Response(status_code=499)  # nobody reads it: "client closed request"

    @app.post(
        "/api/generate/stream",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def generate_stream(req: GenerateRequest) -> StreamingResponse:
        """Generate as server-sent events: ``start`` (prompt tokens, seed), one ``token``
        (index, id, label) a token, then ``done`` (the JSON answer) or ``error``."""
        run = Generation(batcher, req, check_generate(req, cfg, limits), metrics)

        async def stream() -> AsyncIterator[str]:
            yield _sse(
                "start",
                {
                    "prompt_tokens": run.prompt,
                    "labels": labels(run.prompt),
                    "seed": run.seed,
                    "seed_text": str(run.seed),
                },
            )
            async for event in run.events_until_done():
                if isinstance(event, Token):
                    token = {"index": event.index, "token": event.token}
                    yield _sse("token", {**token, "label": byte_label(event.token)})
                elif isinstance(event, Done):
                    yield _sse("done", run.answer(event).model_dump())
                else:
                    yield _sse("error", error_body("body", event.message, "failed"))

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    @app.post("/api/attention")
    async def attention(req: AttentionRequest) -> AttentionResponse:
        """The attention probabilities over ``tokens`` of the asked layers and heads,
        rounded to 6 decimals (``GPT.forward_with_attn_trace``, one call a layer)."""
        layers, heads = check_attention(req, cfg)
        tokens = list(req.tokens)
        maps = await asyncio.wrap_future(
            batcher.call(lambda: attention_maps(served.model, tokens, layers))
        )  # (len(layers), H, t, t)
        chosen = maps[:, heads].double().round(decimals=6)  # (layers, heads, t, t)
        return AttentionResponse(
            tokens=tokens, labels=labels(tokens), layers=layers, heads=heads,
            attention=chosen.tolist(),
        )  # fmt: skip

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        """Prometheus metrics (``metrics.py`` names them)."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    install_openai(app, served, batcher, limits, metrics)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.add_middleware(RequestIds, metrics=metrics)  # outermost: every answer carries its id
    return app


class GenerationFailed(RuntimeError):
    """The model could not finish a request (answered 500, the server goes on)."""


async def _collect(run: Generation) -> GenerateResponse:
    async for event in run.events_until_done():
        if isinstance(event, Done):
            return run.answer(event)
        if isinstance(event, Failed):
            raise GenerationFailed(event.message)
    raise GenerationFailed("the generation ended without an answer")
