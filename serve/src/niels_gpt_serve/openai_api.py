"""The OpenAI-compatible API: ``GET /v1/models``, ``POST /v1/completions``.

A client of that protocol (the official ``openai`` package with
``base_url="http://host:port/v1"``, any API key) gets completions, streamed
or not, through the same batcher, limits and metrics as the page's API.
What it means here:

- tokens are bytes: ``max_tokens`` and ``usage`` count UTF-8 bytes;
- choice ``i`` of a prompt draws with ``seed + i`` (mod 2**63), so a seed
  reproduces every choice; choices are numbered ``prompt_index * n + i``;
- ``stop`` strings are found in the decoded text (``stops.py``), and the text
  ends before the first; ``finish_reason`` is ``stop`` or ``length``;
- ``logprobs: k`` gives each token's log-probability under the model's raw
  softmax (before temperature and top_p) and its ``k`` likeliest
  alternatives; a byte that is not ASCII is named ``bytes:\\xNN``;
- streams are server-sent ``data:`` chunks of ``text_completion`` objects,
  a last chunk a choice with its ``finish_reason``, with
  ``stream_options.include_usage`` a chunk with ``usage``, then ``data: [DONE]``;
- ``/v1/chat/completions`` is refused (400): a byte-level model trained on
  plain text has no chat template.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from niels_gpt_serve.batcher import Batcher, Done, Failed, Token
from niels_gpt_serve.errors import openai_error
from niels_gpt_serve.generation import Generation
from niels_gpt_serve.limits import FieldError, Limits, check_generate
from niels_gpt_serve.metrics import Metrics
from niels_gpt_serve.openai_schemas import CompletionRequest
from niels_gpt_serve.schemas import MAX_SEED, GenerateRequest
from niels_gpt_serve.stops import StopText

__all__ = ["install_openai"]

_RENAMED = {"max_new_tokens": "max_tokens"}
NO_CHAT = (
    "this model reads and writes bytes of plain text and has no chat template; "
    "send a prompt to /v1/completions instead"
)


def token_name(token: int) -> str:
    """A byte as OpenAI names tokens: ASCII as itself, any other byte ``bytes:\\xNN``."""
    return chr(token) if token < 0x80 else f"bytes:\\x{token:02x}"


@dataclass
class Piece:
    """New text of one choice, its tokens' log-probabilities, and how it ended (if it did)."""

    index: int
    text: str
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str | None = None


async def _pieces(index: int, run: Generation, stops: StopText) -> AsyncIterator[Piece]:
    """One choice's pieces, a token at a time; the last one has its ``finish_reason``."""
    async for event in run.events_until_done():
        if isinstance(event, Token):
            text = stops.feed(event.token)
            if stops.stopped:
                yield Piece(index, text, [event], "stop")
                return  # leaving cancels the ticket: the slot is freed at the next step
            yield Piece(index, text, [event])
        elif isinstance(event, Done):
            yield Piece(index, stops.finish(), [], "length" if event.reason == "length" else "stop")
        elif isinstance(event, Failed):
            raise RuntimeError(event.message)


def _logprobs(tokens: list[Token], offset: int) -> dict[str, Any]:
    names = [token_name(t.token) for t in tokens]
    offsets, at = [], offset
    for name in names:
        offsets.append(at)
        at += 1 if len(name) == 1 else 0
    return {
        "tokens": names,
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{token_name(i): lp for i, lp in t.top} for t in tokens],
        "text_offset": offsets,
    }


def install_openai(
    app: FastAPI, served: Any, batcher: Batcher, limits: Limits, metrics: Metrics
) -> None:
    """Add the ``/v1`` routes to ``app`` (``served``: the app's ``Served``)."""
    cfg, model_id = served.config, served.run

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

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        """Refused: a byte-level model has no chat template."""
        return JSONResponse(openai_error(400, "messages", NO_CHAT, "chat_not_supported"), 400)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        """Complete ``prompt`` (see the module docstring)."""
        if req.model != model_id:
            message = f"must be {model_id!r} (GET /v1/models), got {req.model!r}"
            raise FieldError("model", message, 404)
        if req.best_of is not None and req.best_of != req.n:
            raise FieldError("best_of", f"must be null or n={req.n}, got {req.best_of}")
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        seed = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED + 1)
        asks: list[tuple[GenerateRequest, list[int]]] = []
        for p, prompt in enumerate(prompts):
            for i in range(req.n):
                ask = _ask(
                    prompt, req, (seed + i) % (MAX_SEED + 1), p if len(prompts) > 1 else None
                )
                asks.append((ask, _checked(ask, cfg, limits)))
        runs: list[Generation] = []
        try:
            for ask, tokens in asks:
                runs.append(Generation(batcher, ask, tokens, metrics, req.logprobs))
        except BaseException:
            for run in runs:
                run.ticket.cancel()
            raise
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        rid = request.scope.get("state", {}).get("request_id", secrets.token_hex(8))
        head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()),
                "model": model_id}  # fmt: skip
        usage_prompt = sum(len(t) for _, t in asks) // req.n
        sources = [_pieces(i, run, StopText(stops)) for i, run in enumerate(runs)]
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            body = _stream(head, sources, runs, usage_prompt, include, req.logprobs is not None)
            headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        choices = await asyncio.gather(*(_whole(s, req.logprobs is not None) for s in sources))
        completion = sum(len(run.tokens) for run in runs)
        return JSONResponse({**head, "choices": choices, "usage": _usage(usage_prompt, completion)})


def _model(model_id: str, step: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": f"niels-gpt (step {step})"}


def _ask(prompt: str, req: CompletionRequest, seed: int, which: int | None) -> GenerateRequest:
    if not prompt:
        raise FieldError("prompt" if which is None else f"prompt.{which}", "must not be empty")
    return GenerateRequest.model_construct(  # validated as a CompletionRequest; limits next
        prompt=prompt, max_new_tokens=req.max_tokens, temperature=req.temperature,
        top_p=None if req.top_p == 1.0 else req.top_p, top_k=None, seed=seed, eos=None,
    )  # fmt: skip


def _checked(ask: GenerateRequest, cfg: Any, limits: Limits) -> list[int]:
    try:
        return check_generate(ask, cfg, limits)
    except FieldError as err:
        raise FieldError(_RENAMED.get(err.field, err.field), err.message, err.status) from None


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


async def _whole(source: AsyncIterator[Piece], logprobs: bool) -> dict[str, Any]:
    text, tokens, reason, index = "", list[Token](), None, 0
    async for piece in source:
        index, text, reason = piece.index, text + piece.text, piece.finish_reason
        tokens += piece.tokens
    return {"index": index, "text": text, "logprobs": _logprobs(tokens, 0) if logprobs else None,
            "finish_reason": reason}  # fmt: skip


async def _stream(
    head: dict[str, Any], sources: list[AsyncIterator[Piece]], runs: list[Generation],
    prompt_tokens: int, include_usage: bool, logprobs: bool,
) -> AsyncIterator[str]:  # fmt: skip
    queue: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()

    async def pump(source: AsyncIterator[Piece]) -> None:
        try:
            async for piece in source:
                queue.put_nowait(piece)
        except Exception as err:  # handed to the stream, which reports it
            queue.put_nowait(err)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(s)) for s in sources]
    offsets = [0] * len(sources)
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
                continue
            if isinstance(item, BaseException):
                error = openai_error(500, None, f"generation failed: {item}", "failed")
                yield f"data: {json.dumps(error)}\n\n"
                return
            lp = _logprobs(item.tokens, offsets[item.index]) if logprobs else None
            offsets[item.index] += len(item.text)
            choice = {"index": item.index, "text": item.text, "logprobs": lp,
                      "finish_reason": item.finish_reason}  # fmt: skip
            yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
        if include_usage:
            usage = _usage(prompt_tokens, sum(len(run.tokens) for run in runs))
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for run in runs:
            run.ticket.cancel()
