"""Batching: requests decoded together get the tokens each gets alone.

The batcher is driven directly (no HTTP) so a test decides exactly who shares
a step: requests submitted together start in one batch; a request submitted
while another runs joins it between two steps (continuous batching).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from niels_gpt.model.kv_cache import generate as stage_generate
from niels_gpt_serve.app import Served
from niels_gpt_serve.batcher import Batcher, Done, Event, Failed, Token
from niels_gpt_serve.engine import PaddedEngine, Tokens
from niels_gpt_serve.sampling import Knobs

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


@pytest.fixture
def batcher(served: Served) -> Iterator[Batcher]:
    b = Batcher(PaddedEngine(served.model), max_batch=8, window_s=0.05)
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


class Paused(PaddedEngine):
    """A short pause a step, so that a second request surely finds the first running."""

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        time.sleep(0.02)
        return super().next_logits(batch)


def test_a_request_joins_a_running_batch_between_steps(served: Served) -> None:
    batcher = Batcher(Paused(served.model), max_batch=8, window_s=0.0)
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


def test_the_batched_logits_are_each_row_alone(served: Served) -> None:
    class Seq:
        def __init__(self, key: int, text: bytes) -> None:
            self.key, self.tokens = key, list(text)

    seqs: Sequence[Tokens] = [Seq(0, b"a"), Seq(1, b"def f(x):"), Seq(2, b"\x00\xff\n")]
    engine = PaddedEngine(served.model)
    got = engine.next_logits(seqs)  # (3, V)
    for b, seq in enumerate(seqs):
        with torch.no_grad():
            want = served.model(torch.tensor([list(seq.tokens)]))[0, -1]  # (V,)
        torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-5)  # float32
    with pytest.raises(ValueError, match="at least one sequence"):
        engine.next_logits([])


class Breaking(PaddedEngine):
    """Fails every step whose batch holds a sequence ending in byte 0x21 ('!')."""

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        if any(s.tokens[-1] == 0x21 for s in batch):
            raise RuntimeError("boom")
        return super().next_logits(batch)


def test_a_failing_step_fails_its_requests_and_the_batcher_goes_on(served: Served) -> None:
    b = Batcher(Breaking(served.model), max_batch=4, window_s=0.05)
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


def test_cancelled_requests_leave_the_batch(served: Served) -> None:
    b = Batcher(PaddedEngine(served.model), max_batch=2, max_waiting=1, window_s=0.0)
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
