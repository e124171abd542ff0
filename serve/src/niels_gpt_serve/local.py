"""The app on uvicorn in a thread of this process, on 127.0.0.1 (the benchmark's and tests')."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

__all__ = ["ThreadServer"]


class ThreadServer:
    """``with ThreadServer(app) as url:`` serves ``app`` on a free loopback port meanwhile.

    Leaving the block stops uvicorn and waits for its thread, so nothing the
    app holds (a model shared by the caller) is still served afterwards.

    Raises:
        RuntimeError: uvicorn did not start within ``start_s``; or its thread
            still ran ``start_s`` after it was told to stop and again after it
            was forced to (an error already leaving the block keeps its own
            type and gets that sentence as a note instead).
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

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.start_s)
        if self.thread.is_alive():
            self.server.force_exit = True  # open connections and tasks no longer waited for
            self.thread.join(timeout=self.start_s)
        if not self.thread.is_alive():
            return
        why = f"uvicorn did not stop within 2 x {self.start_s} s: its thread still runs"
        if error is None:
            raise RuntimeError(why)
        error.add_note(why)
