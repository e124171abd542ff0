"""What a run shows and records: a rich progress bar and a JSON-lines metrics log.

Only rank 0 shows or writes anything. Text that came from the model or the
corpus is printed with rich markup off and through ``sampling.printable``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Display", "MetricsLog", "rate_text"]


def rate_text(tokens_per_s: float) -> str:
    """How the bar and the closing line print ``TrainResult.tokens_per_s``: ``1,234 tokens/s``."""
    return f"{tokens_per_s:,.0f} tokens/s"


class Display:
    """Progress bar with loss, the run's tokens/s so far and ETA; silent when not ``enabled``."""

    def __init__(self, enabled: bool, total: int, bar: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(stderr=False, highlight=False, soft_wrap=True)
        self._progress: Progress | None = None
        if enabled and bar:
            self._progress = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("train", total=total, loss="-", tps="-")

    @contextlib.contextmanager
    def running(self, first: int) -> Iterator[Display]:
        """Show the bar from step ``first`` (a resumed run starts part-way)."""
        if self._progress is None:
            yield self
            return
        self._progress.reset(self._task, completed=first)
        self._progress.start()
        try:
            yield self
        finally:
            self._progress.stop()

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Show step ``step`` done; ``tokens_per_s`` is the run's so far (``TrainResult``)."""
        if self._progress is not None:
            self._progress.update(
                self._task, completed=step, loss=f"{loss:.4f}", tps=rate_text(tokens_per_s)
            )

    def say(self, text: str) -> None:
        """Print a line above the bar (plain text: no markup, no highlighting)."""
        if self.enabled:
            self.console.print(text, markup=False, highlight=False)


class MetricsLog:
    """``<out>/metrics.jsonl``: one object per step and per evaluation.

    On resume from step ``k`` every line after step ``k`` (left by a run that
    died after its last checkpoint) is dropped, so the log is one clean curve.
    """

    def __init__(self, path: Path, enabled: bool, resume_step: int | None) -> None:
        self.path = path
        self.enabled = enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
            return
        kept = [line for line in self.read(path) if line["step"] <= resume_step]
        path.write_text("".join(json.dumps(line) + "\n" for line in kept))

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write(self, **record: Any) -> None:
        if self.enabled:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
