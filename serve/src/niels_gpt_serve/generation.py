"""One generation request seen from the event loop: its events, timings and answer."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request

from niels_gpt_serve.batcher import Batcher, Done, Event, Ticket, Token
from niels_gpt_serve.metrics import Metrics
from niels_gpt_serve.sampling import Knobs
from niels_gpt_serve.schemas import MAX_SEED, GenerateRequest, GenerateResponse
from niels_gpt_serve.tokens import decode, labels

R = TypeVar("R")

__all__ = ["Generation", "disconnected", "until_disconnected"]


async def disconnected(request: Request) -> None:
    """Return once the client has gone away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(work: Awaitable[R], request: Request, runs: list[Generation]) -> R:
    """``work``'s result, unless the client leaves first: then ``work`` is cancelled, so are
    ``runs``' tickets (their slots free at the next step), and ``CancelledError`` is raised."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():  # the client left: stop generating for it
            task.cancel()
            for run in runs:
                run.ticket.cancel()
    return await task  # done, or cancelled just above


class Generation:
    """One request's events, from the batcher's thread to this event loop."""

    def __init__(
        self,
        batcher: Batcher,
        req: GenerateRequest,
        prompt: list[int],
        metrics: Metrics | None = None,
        logprobs: int | None = None,
    ) -> None:
        self.metrics = metrics
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.seed = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED + 1)
        self.prompt, self.tokens = prompt, list[int]()
        self.start = time.perf_counter()
        self.first_ms = 0.0
        knobs = Knobs(req.temperature, req.top_k, req.top_p)
        self.ticket: Ticket = batcher.submit(
            prompt, req.max_new_tokens, knobs, self.seed, req.eos, self._emit, logprobs=logprobs
        )
        self.last = self.start
        if metrics is not None:
            metrics.tokens.labels("prompt").inc(len(prompt))

    def _emit(self, event: Event) -> None:  # on the batcher's thread
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def events_until_done(self) -> AsyncIterator[Event]:
        """Every event up to and including ``Done`` or ``Failed``; cancels the ticket on exit."""
        try:
            while True:
                event = await self.events.get()
                if isinstance(event, Token):
                    now = time.perf_counter()
                    if not self.tokens:
                        self.first_ms = (now - self.start) * 1e3
                    if self.metrics is not None:
                        timer = self.metrics.per_token if self.tokens else self.metrics.ttft
                        timer.observe(now - self.last)
                        self.metrics.tokens.labels("completion").inc()
                    self.last = now
                    self.tokens.append(event.token)
                yield event
                if not isinstance(event, Token):
                    return
        finally:
            self.ticket.cancel()  # no-op once finished; frees the slot of a client that left

    def answer(self, done: Done) -> GenerateResponse:
        return GenerateResponse(
            prompt_tokens=self.prompt,
            tokens=self.tokens,
            labels=labels([*self.prompt, *self.tokens]),
            text=decode(self.tokens),
            finish_reason=done.reason,
            seed=self.seed,
            seed_text=str(self.seed),
            queued_ms=round(self.first_ms, 3),
            total_ms=round((time.perf_counter() - self.start) * 1e3, 3),
        )
