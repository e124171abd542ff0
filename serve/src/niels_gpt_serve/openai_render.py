"""How ``/v1`` answers are put together: a choice's pieces, the log-probabilities and
their offsets, and the bodies and server-sent chunks of completions and chat completions.

``openai_api.py`` checks a request and submits its choices (a ``Job``); the functions
here turn the choices' pieces into the protocol's JSON, streamed (``*_chunks``, sent by
``sse``) or whole (``*_whole``, one body).
"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from niels_gpt_serve.batcher import Done, Failed, Token
from niels_gpt_serve.errors import openai_error
from niels_gpt_serve.generation import Generation
from niels_gpt_serve.stops import StopText

__all__ = [
    "Echo",
    "Job",
    "Piece",
    "Scored",
    "char_offsets",
    "chat_chunks",
    "chat_whole",
    "pieces",
    "sse",
    "text_chunks",
    "text_whole",
    "token_name",
]

#: A scored token: its id, its log-probability and the likeliest ones (None: not scored).
Scored = tuple[int, float | None, tuple[tuple[int, float], ...] | None]


def token_name(token: int) -> str:
    """A byte as OpenAI names tokens: ASCII as itself, any other byte ``bytes:\\xNN``."""
    return chr(token) if token < 0x80 else f"bytes:\\x{token:02x}"


def char_offsets(data: bytes, start: int = 0) -> list[int]:
    """Where each byte of ``data`` starts in its text, in characters after ``start``: the
    characters decoded from the bytes before it (a character's bytes share its offset)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    offsets, at = [], start
    for byte in data:
        offsets.append(at)
        at += len(decoder.decode(bytes([byte])))
    return offsets


@dataclass
class Piece:
    """New text of one choice, its tokens with their offsets, and how it ended (if it did)."""

    index: int
    text: str
    tokens: list[Token] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    finish_reason: str | None = None


async def pieces(index: int, run: Generation, stops: StopText, base: int) -> AsyncIterator[Piece]:
    """One choice's pieces, a token at a time; the last one has its ``finish_reason``.
    ``base``: the prompt's length in characters, where the first token's offset is."""
    async for event in run.events_until_done():
        if isinstance(event, Token):
            at = base + len(stops.text)  # the characters decoded before this byte
            text = stops.feed(event.token)
            if stops.stopped:
                yield Piece(index, text, [event], [at], "stop")
                return  # leaving cancels the ticket: the slot is freed at the next step
            yield Piece(index, text, [event], [at])
        elif isinstance(event, Done):
            reason = "length" if event.reason == "length" else "stop"
            yield Piece(index, stops.finish(), [], [], reason)
        elif isinstance(event, Failed):
            raise RuntimeError(event.message)


def _logprobs(scored: Sequence[Scored], offsets: Sequence[int]) -> dict[str, Any]:
    return {
        "tokens": [token_name(t) for t, _, _ in scored],
        "token_logprobs": [lp for _, lp, _ in scored],
        "top_logprobs": [
            None if top is None else {token_name(i): lp for i, lp in top} for _, _, top in scored
        ],
        "text_offset": list(offsets),
    }


def _scored(tokens: Sequence[Token]) -> list[Scored]:
    return [(t.token, t.logprob, t.top) for t in tokens]


@dataclass
class Job:
    """The choices of one request, submitted: their runs and pieces, and the prompts'."""

    runs: list[Generation]
    sources: list[AsyncIterator[Piece]]
    prompts: list[str]  # a choice's prompt, by choice index
    prompt_tokens: int  # usage: the prompts' tokens, each prompt once

    def completion_tokens(self) -> int:
        return sum(len(run.tokens) for run in self.runs)

    def usage(self) -> dict[str, int]:
        done = self.completion_tokens()
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}  # fmt: skip

    def cancel(self) -> None:
        for run in self.runs:
            run.ticket.cancel()


Echo = Callable[[int], tuple[str, list[Scored] | None]] | None


def _echo_logprobs(echo: Echo, index: int) -> tuple[str, list[Scored], list[int]]:
    """The prompt of choice ``index`` as ``echo`` shows it: text, scored tokens, offsets."""
    if echo is None:
        return "", [], []
    prompt, scored = echo(index)
    return prompt, list(scored or []), char_offsets(prompt.encode()) if scored else []


async def text_whole(
    head: dict[str, Any], job: Job, logprobs: bool, echo: Echo
) -> AsyncIterator[dict[str, Any]]:
    async def one(index: int, source: AsyncIterator[Piece]) -> dict[str, Any]:
        text, scored, offsets = _echo_logprobs(echo, index)
        reason = None
        async for piece in source:
            text, reason = text + piece.text, piece.finish_reason
            scored += _scored(piece.tokens)
            offsets += piece.offsets
        lp = _logprobs(scored, offsets) if logprobs else None
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": reason}

    choices = await asyncio.gather(*(one(i, s) for i, s in enumerate(job.sources)))
    yield {**head, "choices": choices, "usage": job.usage()}


async def chat_whole(head: dict[str, Any], job: Job) -> AsyncIterator[dict[str, Any]]:
    async def one(index: int, source: AsyncIterator[Piece]) -> dict[str, Any]:
        text, reason = "", None
        async for piece in source:
            text, reason = text + piece.text, piece.finish_reason
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}

    choices = await asyncio.gather(*(one(i, s) for i, s in enumerate(job.sources)))
    yield {**head, "choices": choices, "usage": job.usage()}


async def _merged(job: Job) -> AsyncIterator[Piece]:
    """Every choice's pieces as they come; a failed generation raises ``RuntimeError``."""
    queue: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()

    async def pump(source: AsyncIterator[Piece]) -> None:
        try:
            async for piece in source:
                queue.put_nowait(piece)
        except Exception as err:  # handed to the stream, which reports it
            queue.put_nowait(err)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.ensure_future(pump(s)) for s in job.sources]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise RuntimeError(str(item))
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        job.cancel()


async def text_chunks(
    head: dict[str, Any], job: Job, include_usage: bool, logprobs: bool, echo: Echo
) -> AsyncIterator[dict[str, Any]]:
    if echo is not None:
        for index in range(len(job.sources)):
            text, scored, offsets = _echo_logprobs(echo, index)
            lp = _logprobs(scored, offsets) if logprobs else None
            choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": None}
            yield {**head, "choices": [choice]}
    async for piece in _merged(job):
        lp = _logprobs(_scored(piece.tokens), piece.offsets) if logprobs else None
        choice = {"index": piece.index, "text": piece.text, "logprobs": lp,
                  "finish_reason": piece.finish_reason}  # fmt: skip
        yield {**head, "choices": [choice]}
    if include_usage:
        yield {**head, "choices": [], "usage": job.usage()}


async def chat_chunks(
    head: dict[str, Any], job: Job, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    chunk = {**head, "object": "chat.completion.chunk"}
    for index in range(len(job.sources)):
        delta = {"role": "assistant", "content": ""}
        yield {**chunk, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}
    async for piece in _merged(job):
        delta = {"content": piece.text} if piece.text else {}
        choice = {"index": piece.index, "delta": delta, "logprobs": None,
                  "finish_reason": piece.finish_reason}  # fmt: skip
        yield {**chunk, "choices": [choice]}
    if include_usage:
        yield {**chunk, "choices": [], "usage": job.usage()}


async def sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Server-sent ``data:`` events of ``chunks``, then ``[DONE]``; a failure as an error."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
    except RuntimeError as err:
        error = openai_error(500, None, f"generation failed: {err}", "failed")
        yield f"data: {json.dumps(error)}\n\n"
        return
    yield "data: [DONE]\n\n"
