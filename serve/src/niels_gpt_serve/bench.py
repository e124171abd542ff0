"""Benchmark: batched serving against serving the same clients one by one.

    python -m niels_gpt_serve.bench                      # both model shapes, 8 clients
    python -m niels_gpt_serve.bench --checkpoint runs/v1 --clients 8 --new-tokens 64
    python -m niels_gpt_serve.bench --checkpoint runs/demo --engine cached --threads 1

The app runs on uvicorn in a child process, on 127.0.0.1 (as ``niels-serve``
does: the clients' own work does not share its interpreter); clients are
httpx streams (server-sent events), as the page uses the API. Each round serves the
same ``--clients`` requests (different prompt lengths, seeds, sampled with
top-k) twice: one after another (each alone on the server) and all at once
(batched by the server). Rounds alternate the two, and the figures are the
medians over rounds, so load on a shared machine touches both alike. Printed:
tokens/s of each, their ratio against the 3x target, and the time to the
first token at 1 and at ``--clients`` clients: each pass's line as soon as it
ends (with the load average), the medians after the last round. Never a
test: figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import torch
import uvicorn

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.machine import cpu_name
from niels_gpt_serve.app import ENGINES, Served, create_app
from niels_gpt_serve.cli import listen
from niels_gpt_serve.limits import Limits

__all__ = ["main"]

# Untrained v1 models in the shapes `niels-train` trains: tokens/s does not
# depend on the weights (no eos is asked for, so every request runs to the end).
SHAPES = {
    "quick": ModelConfig(V=256, T=64, C=64, L=2, H=2, d_ff=192, dropout=0.0),
    "default": ModelConfig(V=256, T=256, C=256, L=4, H=4, d_ff=768, dropout=0.0),
}
PROMPTS = ("def ", "class Tree:\n", "import os\nimport sys\n", "    return self.")


@dataclass(frozen=True)
class Run:
    """One pass over the clients: wall time, tokens, and each client's first-token time."""

    wall_s: float
    tokens: int
    first_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def _request(i: int, new_tokens: int) -> dict[str, object]:
    return {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_new_tokens": new_tokens,
        "temperature": 0.8,
        "top_k": 40,
        "seed": i,
    }


async def _client(http: httpx.AsyncClient, body: dict[str, object]) -> tuple[float, int]:
    """One streamed request: (seconds to its first token, tokens received)."""
    start = time.perf_counter()
    first, tokens = 0.0, 0
    async with http.stream("POST", "/api/generate/stream", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line == "event: token":
                tokens += 1
                if tokens == 1:
                    first = time.perf_counter() - start
            elif line.startswith("data: ") and '"finish_reason"' in line:
                assert len(json.loads(line[6:])["tokens"]) == tokens
    return first, tokens


async def _pass(url: str, bodies: Sequence[dict[str, object]], together: bool) -> Run:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        if together:
            done = await asyncio.gather(*(_client(http, b) for b in bodies))
        else:
            done = [await _client(http, b) for b in bodies]
        wall = time.perf_counter() - start
    return Run(wall, sum(n for _, n in done), [f for f, _ in done])


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _served(model: str) -> Served:
    """``"shape:<name>"``: an untrained v1 of that shape; ``"run:<path>"``: a run's model."""
    kind, _, name = model.partition(":")
    if kind == "run":
        from niels_gpt_experiments.loading import load_run

        run = load_run(Path(name), device="cpu")
        if not isinstance(run.model, GPT):
            raise TypeError(f"expected a niels_gpt GPT in {name}, got {type(run.model).__name__}")
        return Served(run.model, run.config, run.arch, Path(name).name, run.step)
    torch.manual_seed(0)
    cfg = SHAPES[name]
    return Served(GPT(cfg).eval(), cfg, "v1", f"untrained-{name}", 0)


def _serve(model: str, engine: str, limits: Limits, threads: int, conn: Connection) -> None:
    """The child process: serve ``model`` on a free loopback port, sent back through ``conn``."""
    if threads:
        torch.set_num_threads(threads)
    served = _served(model)
    app = create_app(served, limits, ENGINES[engine](served.model))
    sock = listen("127.0.0.1", 0)
    conn.send(sock.getsockname()[1])
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@contextlib.contextmanager
def _server(model: str, engine: str, limits: Limits, threads: int) -> Iterator[str]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    args = (model, engine, limits, threads, child)
    process = ctx.Process(target=_serve, args=args, daemon=True)
    process.start()
    try:
        if not parent.poll(120):
            raise RuntimeError("the benchmark's server did not start within 120 s")
        url = f"http://127.0.0.1:{parent.recv()}"
        with httpx.Client(base_url=url) as http:
            for _ in range(600):  # until the app's lifespan has started
                with contextlib.suppress(httpx.HTTPError):
                    if http.get("/api/health").status_code == 200:
                        break
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.join(30)


def bench_model(
    model: str, engine: str, clients: int, new_tokens: int, rounds: int, threads: int = 0
) -> float:
    """Print one model's lines; return the batched / one-by-one tokens/s ratio."""
    bodies = [_request(i, new_tokens) for i in range(clients)]
    serial: list[Run] = []
    batched: list[Run] = []
    limits = Limits(max_new_tokens=new_tokens, max_batch=clients)
    with _server(model, engine, limits, threads) as url:
        info = httpx.get(f"{url}/api/model").json()
        print(f"{model}: {info['arch']} T={info['T']} C={info['C']} L={info['L']} H={info['H']} "
              f"d_ff={info['d_ff']}, {clients} clients x {new_tokens} new tokens, "
              f"{rounds} rounds; engine: {info['engine']}", flush=True)  # fmt: skip
        asyncio.run(_pass(url, bodies[:1], together=False))  # warm-up
        for i in range(rounds):
            serial.append(asyncio.run(_pass(url, bodies, together=False)))
            _say_round(i, "1 client ", serial[-1])
            batched.append(asyncio.run(_pass(url, bodies, together=True)))
            _say_round(i, f"{clients} clients", batched[-1])
    one = statistics.median(r.tokens_per_s for r in serial)
    many = statistics.median(r.tokens_per_s for r in batched)
    ttft_1 = statistics.median(f for r in serial for f in r.first_s) * 1e3
    ttft_n = statistics.median(f for r in batched for f in r.first_s) * 1e3
    ttft_n_max = statistics.median(max(r.first_s) for r in batched) * 1e3
    ratio = many / one
    print(f"  median of {rounds} rounds:", flush=True)
    print(
        f"  one by one      {one:8.0f} tokens/s   time to first token {ttft_1:7.1f} ms (1 client)"
    )
    print(f"  batched         {many:8.0f} tokens/s   time to first token {ttft_n:7.1f} ms median, "
          f"{ttft_n_max:.1f} ms slowest ({clients} clients)")  # fmt: skip
    mark = "met " if ratio >= 3 else "MISS"
    print(f"  [{mark}] batched at {clients} clients >= 3x one by one: {ratio:.2f}x", flush=True)
    return ratio


def _say_round(i: int, who: str, run: Run) -> None:
    """One pass's figures, printed as soon as it ends (a killed run keeps what it printed)."""
    first = statistics.median(run.first_s) * 1e3
    print(f"    round {i + 1}, {who}: {run.tokens_per_s:8.0f} tokens/s, time to first token "
          f"{first:6.1f} ms median, {max(run.first_s) * 1e3:6.1f} ms slowest, "
          f"loadavg {_loadavg()}", flush=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m niels_gpt_serve.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", type=Path, help="a niels-train run instead of the shapes")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="default: both")
    parser.add_argument("--engine", choices=sorted(ENGINES), action="append", help="default: both")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="server's torch threads (0: torch's)"
    )
    args = parser.parse_args(argv)
    if args.clients < 1 or args.new_tokens < 1 or args.rounds < 1:
        parser.error("--clients, --new-tokens and --rounds must be >= 1")
    print(f"niels-serve bench - {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({args.threads or torch.get_num_threads()} threads), "
          f"loadavg at start {_loadavg()}", flush=True)  # fmt: skip
    if args.checkpoint is not None:
        models = [f"run:{args.checkpoint}"]
    else:
        models = [f"shape:{name}" for name in args.shape or ["quick", "default"]]
    for model in models:
        if model.startswith("shape:"):
            T = SHAPES[model[6:]].T
            if max(len(p) for p in PROMPTS) + args.new_tokens > T:
                parser.error(f"--new-tokens {args.new_tokens} does not fit {model}'s T={T}")
        for engine in args.engine or ["cached", "padded"]:
            bench_model(model, engine, args.clients, args.new_tokens, args.rounds, args.threads)
    print(f"loadavg at end {_loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
