"""The OpenAI-compatible API: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``.

A client of that protocol (the official ``openai`` package with
``base_url="http://host:port/v1"``, any API key) gets completions and chat
completions, streamed or not, through the same batcher, limits and metrics
as the page's API. What it means here:

- tokens are bytes: ``max_tokens`` and ``usage`` count UTF-8 bytes;
  ``max_tokens: null`` is as many as the server's ``--max-new-tokens`` and
  the model's context leave room for;
- a temperature below 1e-5 (``schemas.GREEDY_BELOW``) is greedy, as 0 is;
- choice ``i`` of a prompt draws with ``seed + i`` (mod 2**63), so a seed
  reproduces every choice; choices are numbered ``prompt_index * n + i``;
- a request of more choices (prompts x ``n``) than the server ever holds
  (``--max-batch`` + ``--max-waiting``) is a 400 at once, naming that limit;
  one that fits but finds the queue full is a 503 with ``Retry-After``;
- ``stop`` strings are found in the decoded text (``stops.py``), and the text
  ends before the first; ``finish_reason`` is ``stop`` or ``length``;
- ``echo`` puts the prompt before the text (with ``logprobs``, its tokens
  too, the first without a log-probability, as OpenAI's);
- ``logprobs: k`` gives each token's log-probability under the model's raw
  softmax (before temperature and top_p) and its ``k`` likeliest
  alternatives; a byte that is not ASCII is named ``bytes:\\xNN``;
  ``text_offset`` is where the token starts in prompt + text, in characters
  (code points): the bytes of one character share its offset;
- streams are server-sent ``data:`` chunks, a last chunk a choice with its
  ``finish_reason``, with ``stream_options.include_usage`` a chunk with
  ``usage``, then ``data: [DONE]``; ``stream_options`` needs ``stream``;
- a client that leaves, streamed or not, has its generations cancelled;
- chat messages become one prompt in a plain template (``chat.py``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from niels_gpt_serve import chat
from niels_gpt_serve.batcher import Batcher
from niels_gpt_serve.engine import prompt_logprobs
from niels_gpt_serve.errors import openai_error
from niels_gpt_serve.generation import Generation, until_disconnected
from niels_gpt_serve.limits import FieldError, Limits, check_generate
from niels_gpt_serve.metrics import Metrics
from niels_gpt_serve.openai_render import (
    Job,
    Scored,
    chat_chunks,
    chat_whole,
    pieces,
    sse,
    text_chunks,
    text_whole,
)
from niels_gpt_serve.openai_schemas import ChatRequest, CompletionRequest
from niels_gpt_serve.schemas import MAX_SEED, GenerateRequest
from niels_gpt_serve.stops import StopText
from niels_gpt_serve.tokens import encode

__all__ = ["install_openai"]

_RENAMED = {"max_new_tokens": "max_tokens"}


def install_openai(
    app: FastAPI, served: Any, batcher: Batcher, limits: Limits, metrics: Metrics
) -> None:
    """Add the ``/v1`` routes to ``app`` (``served``: the app's ``Served``)."""
    cfg, model_id = served.config, served.run

    def check_model(name: str) -> None:
        if name != model_id:
            message = f"must be {model_id!r} (GET /v1/models), got {name!r}"
            raise FieldError("model", message, 404, "model_not_found")

    def start(req: CompletionRequest, prompts: list[str], stops: list[str]) -> Job:
        """Check every choice against the limits, then submit them all (or none)."""
        total, most = len(prompts) * req.n, limits.max_batch + limits.max_waiting
        if total > most:
            raise FieldError(
                "n" if req.n > 1 else "prompt",
                f"asks for {total} generations ({len(prompts)} prompts x n={req.n}), more "
                f"than this server ever holds at once: --max-batch {limits.max_batch} + "
                f"--max-waiting {limits.max_waiting} = {most}",
                400, "too_many_choices",
            )  # fmt: skip
        seed = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED + 1)
        asks: list[tuple[GenerateRequest, list[int], str]] = []
        for p, prompt in enumerate(prompts):
            for i in range(req.n):
                which = p if len(prompts) > 1 else None
                ask = _ask(prompt, req, (seed + i) % (MAX_SEED + 1), which, cfg.T, limits)
                asks.append((ask, _checked(ask, cfg, limits), prompt))
        runs: list[Generation] = []
        try:
            for ask, tokens, _ in asks:
                runs.append(Generation(batcher, ask, tokens, metrics, req.logprobs))
        except BaseException:
            for run in runs:
                run.ticket.cancel()
            raise
        sources = [
            pieces(i, run, StopText(stops), len(prompt))
            for i, (run, (_, _, prompt)) in enumerate(zip(runs, asks, strict=True))
        ]
        used = sum(len(tokens) for _, tokens, _ in asks) // req.n
        return Job(runs, sources, [prompt for _, _, prompt in asks], used)

    async def answer(
        request: Request, job: Job, render: Callable[[], AsyncIterator[Any]], stream: bool
    ) -> Response:
        """The rendered answer: a stream of chunks, or (not streamed) its one body, which a
        client that leaves first cancels."""
        if stream:
            headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
            return StreamingResponse(sse(render()), media_type="text/event-stream",
                                     headers=headers)  # fmt: skip

        async def whole() -> Any:
            return await anext(render())  # the one body a render yields unstreamed

        try:
            return JSONResponse(await until_disconnected(whole(), request, job.runs))
        except asyncio.CancelledError:
            return Response(status_code=499)  # nobody reads it: "client closed request"

    def stream_only(req: CompletionRequest | ChatRequest) -> None:
        if req.stream_options is not None and not req.stream:
            raise FieldError("stream_options", "is only allowed when stream is true", 400)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The one served model, as OpenAI lists models."""
        return {"object": "list", "data": [_model(model_id, served.step)]}

    @app.get("/v1/models/{name}")
    async def one_model(name: str) -> Any:
        if name != model_id:
            return JSONResponse(
                openai_error(404, "model", f"no model {name!r}", "model_not_found"), 404
            )
        return _model(model_id, served.step)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        """Complete ``prompt`` (see the module docstring)."""
        check_model(req.model)
        stream_only(req)
        if req.best_of is not None and req.best_of != req.n:
            raise FieldError("best_of", f"must be null or n={req.n}, got {req.best_of}")
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        job = start(req, prompts, stops)  # every prompt checked against the limits first
        echoed: dict[str, list[Scored]] = {}
        if req.echo and req.logprobs is not None:
            try:  # the prompts' own tokens, scored between two steps of the batch
                for prompt in dict.fromkeys(prompts):
                    echoed[prompt] = await _score_prompt(
                        batcher, served.model, prompt, req.logprobs
                    )
            except BaseException:
                job.cancel()
                raise
        head = _head(request, "cmpl", "text_completion", model_id)
        lp = req.logprobs is not None
        echo = (lambda i: (job.prompts[i], echoed.get(job.prompts[i]))) if req.echo else None
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            render = lambda: text_chunks(head, job, include, lp, echo)  # noqa: E731
        else:
            render = lambda: text_whole(head, job, lp, echo)  # noqa: E731
        return await answer(request, job, render, req.stream)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> Response:
        """Continue ``messages`` in the plain chat template (``chat.py``)."""
        check_model(req.model)
        stream_only(req)
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            message = "give max_tokens or max_completion_tokens, not both"
            raise FieldError("max_completion_tokens", message, 400)
        most = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
        ask = CompletionRequest.model_construct(
            model=req.model, prompt="", max_tokens=most, temperature=req.temperature,
            top_p=req.top_p, n=req.n, seed=req.seed, logprobs=None,
        )  # fmt: skip
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            job = start(ask, [chat.render(req.messages)], [*stops, chat.STOP])
        except FieldError as err:  # the prompt is made of the messages
            raise FieldError(
                "messages" if err.field == "prompt" else err.field, err.message, err.status,
                err.code,
            ) from None  # fmt: skip
        head = _head(request, "chatcmpl", "chat.completion", model_id)
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            render = lambda: chat_chunks(head, job, include)  # noqa: E731
        else:
            render = lambda: chat_whole(head, job)  # noqa: E731
        return await answer(request, job, render, req.stream)


def _model(model_id: str, step: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": f"niels-gpt (step {step})"}


def _head(request: Request, prefix: str, kind: str, model_id: str) -> dict[str, Any]:
    rid = request.scope.get("state", {}).get("request_id", secrets.token_hex(8))
    return {"id": f"{prefix}-{rid}", "object": kind, "created": int(time.time()),
            "model": model_id}  # fmt: skip


async def _score_prompt(batcher: Batcher, model: Any, prompt: str, k: int) -> list[Scored]:
    """The prompt's tokens as ``echo`` with ``logprobs`` shows them: the first unscored."""
    tokens = encode(prompt)
    scores = await asyncio.wrap_future(batcher.call(lambda: prompt_logprobs(model, tokens, k)))
    first: Scored = (tokens[0], None, None)
    return [first, *((t, lp, top) for t, (lp, top) in zip(tokens[1:], scores, strict=True))]


def _ask(
    prompt: str, req: CompletionRequest, seed: int, which: int | None, T: int, limits: Limits
) -> GenerateRequest:
    if not prompt:
        raise FieldError("prompt" if which is None else f"prompt.{which}", "must not be empty")
    most = req.max_tokens
    if most is None:  # no limit of the client's own: the server's and the context's
        most = max(0, min(limits.max_new_tokens, T - len(encode(prompt))))
    return GenerateRequest.model_construct(  # validated as a CompletionRequest; limits next
        prompt=prompt, max_new_tokens=most, temperature=req.temperature,
        top_p=None if req.top_p == 1.0 else req.top_p, top_k=None, seed=seed, eos=None,
    )  # fmt: skip


def _checked(ask: GenerateRequest, cfg: Any, limits: Limits) -> list[int]:
    try:
        return check_generate(ask, cfg, limits)
    except FieldError as err:
        raise FieldError(_RENAMED.get(err.field, err.field), err.message, err.status) from None
