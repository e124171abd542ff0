"""The app on uvicorn in a thread of this process, on 127.0.0.1 (the benchmark's and tests')."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

__all__ = ["ThreadServer"]


class ThreadServer:
    """``with ThreadServer(app) as url:`` serves ``app`` on a free loopback port meanwhile.

    Raises:
        RuntimeError: uvicorn did not start within ``start_s``.
    """

    def __init__(self, app: FastAPI, start_s: float = 20.0) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.start_s = start_s

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.start_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start within {self.start_s} s")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.start_s)
