"""Batching: requests decoded together get the tokens each gets alone.

The batcher is driven directly (no HTTP) so a test decides exactly who shares
a step: requests submitted together start in one batch; a request submitted
while another runs joins it between two steps (continuous batching).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate as stage_generate
from niels_gpt_serve.app import Served
from niels_gpt_serve.batcher import Batcher, Done, Event, Failed, Token
from niels_gpt_serve.cached import CachedEngine
from niels_gpt_serve.engine import Engine, PaddedEngine, Tokens
from niels_gpt_serve.sampling import Knobs

from .conftest import SlowEngine

REQUESTS: list[tuple[str, int, Knobs, int, int | None]] = [
    ("d", 20, Knobs(0.0), 0, None),
    ("def value(self):\n", 12, Knobs(1.0), 11, None),
    ("class A:\n    ", 20, Knobs(0.8, top_k=10), 12, None),
    ("import ", 5, Knobs(1.2, top_p=0.7), 13, None),
    ("for x in range(", 20, Knobs(0.9, top_k=30, top_p=0.95), 14, 10),  # stops at a newline
    ("\xff\x00 bytes", 16, Knobs(2.0), 15, None),
]


class Collector:
    """A request's events as the batcher's thread emits them."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def __call__(self, event: Event) -> None:
        self.events.put(event)

    def tokens(self, seen: int = 0, timeout: float = 60) -> tuple[list[int], Event]:
        """The tokens after the ``seen`` already taken, and the closing event."""
        tokens: list[int] = []
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, Token):
                assert event.index == seen + len(tokens)
                tokens.append(event.token)
            else:
                return tokens, event


ENGINES: dict[str, Callable[[GPT], Engine]] = {"cached": CachedEngine, "padded": PaddedEngine}


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest, served: Served) -> Iterator[Engine]:
    """Each engine in turn (the tests run once with each)."""
    made = ENGINES[request.param](served.model)
    yield made
    made.close()


@pytest.fixture
def batcher(engine: Engine) -> Iterator[Batcher]:
    b = Batcher(engine, max_batch=8, window_s=0.05)
    b.start()
    yield b
    b.close()


def submit(batcher: Batcher, spec: tuple[str, int, Knobs, int, int | None]) -> Collector:
    prompt, new, knobs, seed, eos = spec
    sink = Collector()
    batcher.submit(list(prompt.encode("latin-1")), new, knobs, seed, eos, sink)
    return sink


def alone(served: Served, spec: tuple[str, int, Knobs, int, int | None]) -> list[int]:
    """The stage's own ``kv_cache.generate`` of the request alone, cut after eos."""
    prompt, new, knobs, seed, eos = spec
    ids = torch.tensor([list(prompt.encode("latin-1"))])  # (1, t)
    out = stage_generate(
        served.model, ids, new, temperature=knobs.temperature, top_k=knobs.top_k,
        top_p=knobs.top_p, eos_id=eos, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    assert isinstance(out, torch.Tensor)
    tokens: list[int] = out[0, ids.shape[1] :].tolist()
    return tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


def test_requests_that_arrive_together_share_steps_and_keep_their_tokens(
    batcher: Batcher, served: Served
) -> None:
    sinks = [submit(batcher, spec) for spec in REQUESTS]
    results = [sink.tokens() for sink in sinks]
    assert batcher.stats()["largest_batch"] == len(REQUESTS)  # they did run as one batch
    for spec, (tokens, done) in zip(REQUESTS, results, strict=True):
        assert tokens == alone(served, spec), spec
        eos = spec[4]
        want = "eos" if eos is not None and eos in tokens else "length"
        assert done == Done(want)  # type: ignore[arg-type]
    assert any(d == Done("eos") for _, d in results)  # the eos row left early


class Paused(SlowEngine):
    """A short pause a step, so that a second request surely finds the first running."""

    def __init__(self, inner: Engine) -> None:
        self.inner, self.name, self.pause_s = inner, inner.name, 0.02


def test_a_request_joins_a_running_batch_between_steps(served: Served, engine: Engine) -> None:
    batcher = Batcher(Paused(engine), max_batch=8, window_s=0.0)
    batcher.start()
    long_spec = ("while True:\n", 40, Knobs(0.9, top_k=50), 21, None)
    late_spec = ("x = ", 10, Knobs(1.1), 22, None)
    try:
        first = submit(batcher, long_spec)
        early = [first.events.get(timeout=60) for _ in range(5)]  # the first run is under way
        assert all(isinstance(e, Token) for e in early)
        late = submit(batcher, late_spec)
        late_tokens, late_done = late.tokens()
        rest, first_done = first.tokens(seen=5)
        assert batcher.stats()["largest_batch"] == 2
    finally:
        batcher.close()
    assert [e.token for e in early if isinstance(e, Token)] + rest == alone(served, long_spec)
    assert late_tokens == alone(served, late_spec)
    assert late_done == first_done == Done("length")


class Seq:
    def __init__(self, key: int, text: bytes) -> None:
        self.key, self.tokens = key, list(text)


def test_the_batched_logits_are_each_row_alone_as_rows_join_and_leave(
    served: Served, engine: Engine
) -> None:
    """A schedule of joins and leaves; at every step each row's logits are the row alone's."""
    a, b, c, d = Seq(0, b"a"), Seq(1, b"def f(x):"), Seq(2, b"\x00\xff\n"), Seq(3, b"class T:")
    schedule: list[list[Seq]] = [[a, b], [a, b], [a, b, c], [b, c], [b, c, d], [d], [c, d, a]]
    a2 = Seq(4, b"x" * 30)  # longer than the frame so far: the others shift right
    schedule += [[c, d, a2], [d, a2], [a2]]
    for step, batch in enumerate(schedule):
        got = engine.next_logits(batch)  # (B, V)
        for row, seq in enumerate(batch):
            with torch.no_grad():
                want = served.model(torch.tensor([seq.tokens]))[0, -1]  # (V,)
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-4, msg=f"step {step}")
            seq.tokens.append((7 * step + row) % 256)  # the next token, any id
        following = {s.key for s in schedule[step + 1]} if step + 1 < len(schedule) else set()
        for gone in {s.key for s in batch} - following:
            engine.release(gone)
    with pytest.raises(ValueError, match="at least one sequence"):
        engine.next_logits([])


class Breaking(SlowEngine):
    """Fails every step whose batch holds a sequence ending in byte 0x21 ('!')."""

    def __init__(self, inner: Engine) -> None:
        self.inner, self.name, self.pause_s = inner, inner.name, 0.0

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        if any(s.tokens[-1] == 0x21 for s in batch):
            raise RuntimeError("boom")
        return super().next_logits(batch)


def test_a_failing_step_fails_its_requests_and_the_batcher_goes_on(
    served: Served, engine: Engine
) -> None:
    b = Batcher(Breaking(engine), max_batch=4, window_s=0.05)
    b.start()
    try:
        bad = submit(b, ("oops!", 5, Knobs(0.0), 0, None))
        tokens, event = bad.tokens()
        assert tokens == [] and isinstance(event, Failed) and "boom" in event.message
        good = submit(b, ("fine", 5, Knobs(0.0), 0, None))
        tokens, event = good.tokens()
        assert event == Done("length") and tokens == alone(served, ("fine", 5, Knobs(0.0), 0, None))
        assert b.stats()["failed"] == 1 and b.stats()["served"] == 1
    finally:
        b.close()


def test_cancelled_requests_leave_the_batch(engine: Engine) -> None:
    b = Batcher(engine, max_batch=2, max_waiting=1, window_s=0.0)
    b.start()
    try:
        sinks: list[Any] = []
        tickets = []
        for i in range(3):
            sinks.append(Collector())
            tickets.append(b.submit([100 + i], 60, Knobs(1.0), i, None, sinks[-1]))
        with pytest.raises(Exception, match="limit is 2 \\+ 1"):
            b.submit([1], 5, Knobs(), 0, None, Collector())
        sinks[0].events.get(timeout=60)
        for ticket in tickets:
            ticket.cancel()
        deadline = time.monotonic() + 30
        while b.stats()["running"] + b.stats()["waiting"] and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = b.stats()
        assert stats["running"] == stats["waiting"] == 0 and stats["cancelled"] == 3
        assert stats["tokens"] < 3 * 60  # they stopped early
        tokens, done = submit(b, ("ok", 3, Knobs(0.0), 0, None)).tokens()
        assert done == Done("length") and len(tokens) == 3  # the slots are free again
    finally:
        b.close()


def test_calls_run_between_steps_on_the_worker_thread(batcher: Batcher) -> None:
    names: list[str] = []
    future = batcher.call(lambda: names.append(threading.current_thread().name) or 7)
    assert future.result(timeout=30) == 7 and names == ["niels-serve-batcher"]
    boom = batcher.call(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        boom.result(timeout=30)


def test_the_cached_engine_hands_the_model_back_as_it_found_it(served: Served) -> None:
    """No hook and no cache stays on the model after a call, returned or raised."""
    modules = [m for m in served.model.modules() if isinstance(m, CausalSelfAttention)]

    def untouched() -> bool:
        return all(not m._forward_pre_hooks and "kv_cache" not in m.__dict__
                   for m in modules)  # fmt: skip

    engine = CachedEngine(served.model)
    engine.next_logits([Seq(0, b"ab"), Seq(1, b"c")])
    assert untouched()
    with pytest.raises(AssertionError, match=r"cfg\.T"):  # InputError: longer than T
        engine.next_logits([Seq(2, bytes(served.config.T + 1))])
    assert untouched()
