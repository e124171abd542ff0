"""``niels-serve``: serve a ``niels-train`` run as a web page and an HTTP API.

    niels-serve                              # the newest run under runs/, or the shipped demo
    niels-serve --demo                       # runs/demo, trained first (once) if not there
    niels-serve --checkpoint runs/v1         # that run's newest checkpoint
    niels-serve --port 8000 --host 127.0.0.1
    niels-serve --quant int8                 # the linear layers' weights in int8 (niels-gpt-quant)

It prints the page's URL once the socket listens; Ctrl+C (or SIGTERM) stops it after
the open requests finish, with exit status 0.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["apply_quant", "build_parser", "listen", "main"]

#: Seconds open requests get to finish after SIGINT or SIGTERM before they are cut.
DRAIN_S = 30
#: ``Limits``' fields, by the flag that sets each (their errors name the flag).
_LIMIT_FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "max_body_bytes": "--max-body-bytes",
    "max_batch": "--max-batch",
    "max_waiting": "--max-waiting",
}


class _Stopped(Exception):
    """SIGINT or SIGTERM reached ``main`` (uvicorn re-raises the signal once it has drained)."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="niels-serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--checkpoint", type=Path, help="a niels-train run folder (default: the newest in --runs)"
    )
    which.add_argument(
        "--demo",
        action="store_true",
        help="serve <runs>/demo, training it first (once: minutes) if it is not there; "
        "without a run, niels-serve serves the demo model shipped in the package",
    )
    add("--runs", type=Path, default=Path("runs"), help="where runs are (default: %(default)s)")
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=8000, help="0 picks a free port (default: %(default)s)")
    add("--device", default="cpu", help="cpu, cuda or mps (default: %(default)s)")
    add(
        "--engine",
        choices=("cached", "padded"),
        default="cached",
        help="cached: KV caches, rows join between steps; padded: recompute (default: %(default)s)",
    )
    add(
        "--quant",
        choices=("none", "int8"),
        default="none",
        help="int8: weight-only int8 linear layers, float head and embedding "
        "(default: %(default)s)",
    )
    add("--max-new-tokens", type=int, default=256, help="cap on a request's max_new_tokens")
    add("--max-batch", type=int, default=16, help="requests decoded together at most")
    add("--max-waiting", type=int, default=256, help="requests queued beyond the batch at most")
    add("--max-body-bytes", type=int, default=65_536, help="largest request body")
    add("--log-level", default="warning", help="uvicorn's log level (default: %(default)s)")
    return parser


def apply_quant(model: nn.Module, quant: str) -> str:
    """Quantize ``model`` in place as ``--quant`` says; the words the start line adds.

    ``none`` leaves it as loaded; ``int8`` runs ``niels_gpt.model.quant.quantize_int8``
    (every untied Linear; GPT's tied head and embedding stay float).
    """
    if quant == "none":
        return ""
    if quant != "int8":
        raise ValueError(f"--quant must be none or int8, got {quant!r}")
    from niels_gpt.model.quant import quantize_int8

    quantize_int8(model)
    return ", int8 linear weights"


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one) for uvicorn.

    It is made with ``IPPROTO_TCP`` named: asyncio sets ``TCP_NODELAY`` only on
    connections whose socket says so, and without it Nagle's algorithm holds
    each small server-sent event until the client's delayed ACK (~40 ms).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``niels-serve``. Exit 0 on Ctrl+C; 1 no model (a damaged run, a demo
    training that failed) or no socket; 2 an input error, naming its flag (a bad value, a
    ``--checkpoint`` that is not a run folder, a ``--device`` this machine lacks)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    from niels_gpt_experiments.flags import folder_problem, with_flags
    from niels_gpt_serve.limits import Limits

    try:
        limits = Limits(args.max_new_tokens, args.max_body_bytes, args.max_batch, args.max_waiting)
    except ValueError as err:
        parser.error(with_flags(str(err), _LIMIT_FLAGS, lambda f: getattr(args, f, None)))
    if args.checkpoint is None and (problem := folder_problem(args.runs)) is not None:
        parser.error(f"--runs {args.runs}: {problem}")
    from niels_gpt.device import DeviceUnavailableError, resolve_device  # torch loads here

    try:
        resolve_device(args.device)  # before a demo model trains for minutes
    except (ValueError, DeviceUnavailableError) as err:
        parser.error(f"--device {args.device}: {str(err).splitlines()[0]}")

    import uvicorn

    from niels_gpt.model.gpt import GPT
    from niels_gpt_experiments.loading import load_run
    from niels_gpt_serve.app import ENGINES, Served, create_app
    from niels_gpt_serve.runs import NotARunError, ServeError, choose_run, stderr
    from niels_gpt_serve.shipped import SHIPPED_NAME, load_shipped, shipped_dir
    from niels_gpt_serve.trained import Training, read_training

    shipped = (shipped_dir() / f"{SHIPPED_NAME}.safetensors").is_file()
    try:
        try:
            run_dir = choose_run(args.checkpoint, args.runs, stderr, args.demo, shipped)
        except NotARunError as err:
            parser.error(str(err))
        if run_dir is None:
            ready = load_shipped(args.device)
            where = f"the shipped demo model ({shipped_dir() / SHIPPED_NAME}.safetensors)"
            served = Served(ready.model, ready.config, ready.arch, SHIPPED_NAME, ready.step,
                            ready.training)  # fmt: skip
        else:
            loaded = load_run(run_dir, device=args.device)
            if not isinstance(loaded.model, GPT):
                print(f"niels-serve: expected a niels_gpt GPT in {run_dir}, got "
                      f"{type(loaded.model).__name__}", file=sys.stderr)  # fmt: skip
                return 1
            training = read_training(run_dir, loaded.step, loaded.meta)
            where = str(run_dir)
            served = Served(loaded.model, loaded.config, loaded.arch, run_dir.name, loaded.step,
                            training)  # fmt: skip
    except (ServeError, OSError, ValueError, RuntimeError) as err:
        print(f"niels-serve: {err}", file=sys.stderr)
        return 1
    quantized = apply_quant(served.model, args.quant)
    app = create_app(served, limits, ENGINES[args.engine](served.model))
    try:
        sock = listen(args.host, args.port)
    except OSError as err:
        print(f"niels-serve: cannot listen on {args.host}:{args.port}: {err}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    cfg = served.config
    print(
        f"niels-serve: {served.arch} (T={cfg.T} C={cfg.C} L={cfg.L} H={cfg.H} "
        f"H_kv={cfg.kv_heads}) from {where}, "
        f"step {served.step}{quantized}",
        flush=True,
    )
    known = served.training or Training(step=served.step)
    print(f"niels-serve: {known.summary()}", flush=True)
    print(f"niels-serve: open http://{shown}:{port}/ (Ctrl+C stops)", flush=True)
    config = uvicorn.Config(
        app, log_level=args.log_level, lifespan="on", timeout_graceful_shutdown=DRAIN_S
    )
    # uvicorn takes SIGINT and SIGTERM while it serves, stops listening, lets open requests
    # finish (at most DRAIN_S), then raises the signal again with these handlers back.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except _Stopped as stopped:
        print(f"niels-serve: stopped ({stopped})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
