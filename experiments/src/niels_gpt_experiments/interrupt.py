"""Ctrl+C while training: stop at the end of the step, with a checkpoint.

A ``KeyboardInterrupt`` raised in the middle of a step could leave the model
half-updated (between two of AdamW's tensor updates), so the first SIGINT
only asks the loop to stop (``StopRequest.requested``); the loop finishes
the step, saves a checkpoint and raises ``TrainingInterrupted``. A second
SIGINT raises ``KeyboardInterrupt`` at once, as Python's default does; the
loop turns that into ``TrainingInterrupted`` naming the last checkpoint it
had saved before.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

__all__ = ["StopRequest", "TrainingInterrupted"]


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on Ctrl+C after ``step`` steps.

    ``checkpoint`` is the newest checkpoint of the run (``None``: none yet);
    ``saved_now`` says whether it was written at the interrupt; ``rank`` is the
    process's rank under ``torchrun`` (only rank 0 reports it). A subclass of
    ``KeyboardInterrupt``, so code that catches ``Exception`` lets it through.
    """

    def __init__(self, step: int, checkpoint: Path | None, saved_now: bool, rank: int = 0) -> None:
        super().__init__(step, checkpoint, saved_now, rank)
        self.step = step
        self.checkpoint = checkpoint
        self.saved_now = saved_now
        self.rank = rank


class StopRequest:
    """Whether a SIGINT asked the training loop to stop; see the module docstring."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one stops now

    @contextlib.contextmanager
    def catching(self) -> Iterator[StopRequest]:
        """Catch SIGINT while the block runs, then put the previous handler back.

        Nothing changes off the main thread (Python delivers signals there
        only) or where SIGINT is ignored (``command &`` in a script).
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            yield self
            return
        signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(
                signal.SIGINT, signal.default_int_handler if previous is None else previous
            )
