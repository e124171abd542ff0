"""``ThreadServer``: the app served in a thread, and gone when the block is left."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from niels_gpt_serve.local import ThreadServer


def _stuck_app(release: threading.Event) -> FastAPI:
    """An app whose shutdown blocks the event loop until ``release`` is set."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        release.wait(timeout=30)  # a blocking call in the loop: uvicorn cannot finish

    return FastAPI(lifespan=lifespan)


def test_the_server_is_gone_when_the_block_is_left() -> None:
    server = ThreadServer(FastAPI())
    with server as url:
        assert httpx.get(f"{url}/openapi.json").status_code == 200
    assert not server.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/openapi.json")


def test_a_server_that_does_not_stop_is_an_error() -> None:
    release = threading.Event()
    server = ThreadServer(_stuck_app(release), start_s=0.5)
    try:
        with pytest.raises(RuntimeError, match=r"did not stop within 2 x 0\.5 s"), server:
            pass
    finally:
        release.set()
        server.thread.join(timeout=30)
    assert not server.thread.is_alive()


def test_an_error_in_the_block_keeps_its_type_and_is_told_the_server_stayed() -> None:
    release = threading.Event()
    server = ThreadServer(_stuck_app(release), start_s=0.5)
    try:
        with pytest.raises(KeyError) as raised, server:
            raise KeyError("the caller's own error")
    finally:
        release.set()
        server.thread.join(timeout=30)
    assert any("did not stop" in note for note in raised.value.__notes__)
