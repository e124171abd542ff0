"""The batcher: one worker thread that owns the model and decodes every request together.

Requests are queued (``submit``); between two decode steps the worker admits
waiting requests into the running batch (up to ``max_batch``), drops the ones
whose client went away, runs one engine step for the whole batch and hands
each request its next token through its ``emit`` callback. A request leaves
the batch when it reaches its ``max_new_tokens`` or its ``eos`` token, so a
new one can take its slot at the next step: continuous batching, as vLLM and
TGI do it, here over a stateless engine. Other work on the model (the
attention of a finished generation) runs on the same thread between steps
(``call``), so nothing else ever touches the model while a step runs.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import torch

from niels_gpt_serve.engine import Engine
from niels_gpt_serve.sampling import Knobs, choose, new_generator

__all__ = ["Batcher", "Busy", "Done", "Event", "Failed", "Ticket", "Token"]

R = TypeVar("R")


@dataclass(frozen=True)
class Token:
    """The ``index``-th new token (0-based) of a request."""

    index: int
    token: int
    logprob: float | None = None  # log-softmax of the raw logits, when the request asked
    top: tuple[tuple[int, float], ...] = ()  # the ``logprobs`` likeliest (token, logprob)


@dataclass(frozen=True)
class Done:
    """A request finished: ``"length"`` (``max_new_tokens`` reached) or ``"eos"``."""

    reason: Literal["length", "eos"]


@dataclass(frozen=True)
class Failed:
    """A request could not be finished; ``message`` says why."""

    message: str


Event = Token | Done | Failed


class Busy(RuntimeError):
    """Too many requests are waiting; try again later."""


@dataclass(eq=False)
class Ticket:
    """One generation request inside the batcher (its ``key`` and ``tokens`` feed the engine)."""

    key: int
    tokens: list[int]
    max_new_tokens: int
    knobs: Knobs
    generator: torch.Generator
    eos: int | None
    emit: Callable[[Event], None]
    logprobs: int | None = None
    new: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """The client went away: the worker drops the request before its next step."""
        self.cancelled.set()


@dataclass
class Stats:
    """Counters since start (read with ``Batcher.stats``)."""

    served: int = 0
    cancelled: int = 0
    failed: int = 0
    steps: int = 0
    tokens: int = 0
    largest_batch: int = 0


class Batcher:
    """Decode queued requests in one batch on a worker thread.

    Args:
        engine: gives the next-token logits of a batch (``engine.Engine``).
        max_batch: requests decoded together at most (the slots).
        max_waiting: requests queued beyond the slots at most; ``submit``
            raises ``Busy`` once ``max_batch + max_waiting`` are in.
        window_s: when the batch is empty, wait this long after the first
            request for others that arrive with it, so they start together.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = 16,
        max_waiting: int = 256,
        window_s: float = 0.002,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1 or max_waiting < 0 or window_s < 0:
            raise ValueError(
                f"need max_batch >= 1, max_waiting >= 0, window_s >= 0; got {max_batch}, "
                f"{max_waiting}, {window_s}"
            )
        self.engine = engine
        self.on_step = on_step  # called with each step's batch size (the metrics)
        self.max_batch, self.max_waiting, self.window_s = max_batch, max_waiting, window_s
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._active: list[Ticket] = []
        self._calls: deque[tuple[Callable[[], object], concurrent.futures.Future[object]]] = deque()
        self._keys = itertools.count()
        self._closed = False
        self._stats = Stats()
        self._thread = threading.Thread(target=self._run, name="niels-serve-batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the worker; waiting and running requests get ``Failed``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(
        self,
        prompt: list[int],
        max_new_tokens: int,
        knobs: Knobs,
        seed: int,
        eos: int | None,
        emit: Callable[[Event], None],
        *,
        logprobs: int | None = None,
    ) -> Ticket:
        """Queue a request; ``emit`` gets its events, on the worker thread.

        Raises:
            Busy: ``max_batch + max_waiting`` requests are already in.
            RuntimeError: the batcher is closed.
        """
        ticket = Ticket(
            next(self._keys), list(prompt), max_new_tokens, knobs, new_generator(seed), eos, emit,
            logprobs,
        )  # fmt: skip
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._refuse_if_full()
            self._waiting.append(ticket)
            self._cond.notify_all()
        return ticket

    def _refuse_if_full(self) -> None:
        """Under the lock: raise ``Busy`` once ``max_batch + max_waiting`` requests are in
        (generations running or waiting, and calls waiting alike)."""
        running, waiting = len(self._active), len(self._waiting) + len(self._calls)
        if running + waiting >= self.max_batch + self.max_waiting:
            raise Busy(
                f"{running} requests are running and {waiting} waiting "
                f"(the limit is {self.max_batch} + {self.max_waiting}); try again"
            )

    def call(self, fn: Callable[[], R]) -> concurrent.futures.Future[R]:
        """Run ``fn`` on the worker thread between two steps (one call a step, so calls
        cannot starve generation); its result comes in the future.

        Raises:
            Busy: as ``submit``: a call waits in the same queue, under the same limit.
            RuntimeError: the batcher is closed.
        """
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._refuse_if_full()
            self._calls.append((fn, future))  # type: ignore[arg-type]
            self._cond.notify_all()
        return future

    def stats(self) -> dict[str, int]:
        """Counters, and the requests running and waiting now."""
        with self._cond:
            s = self._stats
            return {
                "running": len(self._active),
                "waiting": len(self._waiting) + len(self._calls),
                "served": s.served,
                "cancelled": s.cancelled,
                "failed": s.failed,
                "steps": s.steps,
                "tokens": s.tokens,
                "largest_batch": s.largest_batch,
            }

    # --- the worker thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._closed or self._waiting or self._active or self._calls):
                    self._cond.wait()
                if self._closed:
                    break
                if not self._active and self._waiting and not self._calls and self._gather():
                    break
                calls = [self._calls.popleft()] if self._calls else []
                self._admit()
                batch = list(self._active)
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except Exception as err:  # handed to the caller, never lost
                        future.set_exception(err)
            if batch:
                self._step(batch)
        self._fail_all("the server is shutting down")

    def _gather(self) -> bool:
        """Under the lock, with an idle batch: wait ``window_s`` for requests that arrive
        together with the first, so they start together. True if closed meanwhile."""
        deadline = time.monotonic() + self.window_s
        while not self._closed and (left := deadline - time.monotonic()) > 0:
            self._cond.wait(left)
        return self._closed

    def _admit(self) -> None:
        """Under the lock: drop cancelled requests, fill free slots from the queue."""
        for ticket in [t for t in self._active if t.cancelled.is_set()]:
            self._leave(ticket, cancelled=True)
        kept = deque(t for t in self._waiting if not t.cancelled.is_set())
        self._stats.cancelled += len(self._waiting) - len(kept)
        self._waiting = kept
        while self._waiting and len(self._active) < self.max_batch:
            ticket = self._waiting.popleft()
            if ticket.max_new_tokens == 0:
                self._stats.served += 1
                ticket.emit(Done("length"))
            else:
                self._active.append(ticket)
        self._stats.largest_batch = max(self._stats.largest_batch, len(self._active))

    def _leave(self, ticket: Ticket, *, cancelled: bool = False) -> None:
        """Under the lock: take ``ticket`` out of the running batch."""
        self._active.remove(ticket)
        self.engine.release(ticket.key)
        if cancelled:
            self._stats.cancelled += 1

    def _step(self, batch: list[Ticket]) -> None:
        """One decode step of ``batch``: a token for each request, finished ones leave."""
        try:
            logits = self.engine.next_logits(batch)  # (B, V)
        except Exception as err:  # every request of the step fails; the server goes on
            with self._cond:
                for ticket in batch:
                    if ticket in self._active:
                        self._leave(ticket)
                    self._stats.failed += 1
                    ticket.emit(Failed(f"generation failed: {type(err).__name__}: {err}"))
            return
        if self.on_step is not None:
            self.on_step(len(batch))
        finished: list[tuple[Ticket, Event]] = []
        for ticket, row in zip(batch, logits, strict=True):
            try:
                token = choose(row, ticket.knobs, ticket.generator)  # row: (V,)
            except Exception as err:
                finished.append((ticket, Failed(f"sampling failed: {err}")))
                continue
            ticket.tokens.append(token)
            ticket.emit(_token(ticket, token, row))
            ticket.new += 1
            if ticket.eos is not None and token == ticket.eos:
                finished.append((ticket, Done("eos")))
            elif ticket.new >= ticket.max_new_tokens:
                finished.append((ticket, Done("length")))
        with self._cond:
            self._stats.steps += 1
            self._stats.tokens += len(batch)
            for ticket, event in finished:
                self._leave(ticket)
                if isinstance(event, Failed):
                    self._stats.failed += 1
                else:
                    self._stats.served += 1
                ticket.emit(event)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            pending = [*self._active, *self._waiting]
            self._active.clear()
            self._waiting.clear()
            calls = list(self._calls)
            self._calls.clear()
        for ticket in pending:
            ticket.emit(Failed(message))
        for _, future in calls:
            future.cancel()


def _token(ticket: Ticket, token: int, row: torch.Tensor) -> Token:
    """The ``Token`` event, with log-probabilities from ``row`` ``(V,)`` if the ticket asked."""
    if ticket.logprobs is None:
        return Token(ticket.new, token)
    logp = torch.log_softmax(row.detach().to("cpu", torch.float64), dim=-1)  # (V,)
    values, ids = logp.topk(min(ticket.logprobs, logp.numel()))  # (k,), (k,)
    top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return Token(ticket.new, token, float(logp[token]), top)
