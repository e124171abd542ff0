"""What a run shows and records: progress (a rich bar on a terminal, a plain line
per interval in a log) and a JSON-lines metrics log.

Only rank 0 shows or writes anything. Text that came from the model or the
corpus is printed with rich markup off and through ``sampling.printable``.
"""

from __future__ import annotations

import contextlib
import json
import time
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
    """Progress with loss, the run's tokens/s so far and ETA; silent when not ``enabled``.

    On a terminal it is rich's live bar. Anywhere else (a CI log, ``nohup``,
    ``| tee``), where a live bar would reach the log only when it stops, it is
    one plain line per ``every_s`` seconds, after the first step and after the
    last one shown: ``step 40/1000  loss 2.3456  1,234 tokens/s  elapsed
    0:00:31  ETA 0:12:00``. Both read the same rich task (its ETA is rich's,
    from the speed of the last 30 s). ``bar=False`` shows neither.
    """

    def __init__(
        self,
        enabled: bool,
        total: int,
        bar: bool = True,
        every_s: float = 15.0,
        console: Console | None = None,
    ) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=False, highlight=False, soft_wrap=True)
        self.every_s = every_s
        self.live = self.console.is_terminal  # a bar on a terminal, lines elsewhere
        self._progress: Progress | None = None
        self._total = total
        self._shown = -1  # the step of the last line printed (lines only)
        self._at = 0  # the last step updated
        self._printed_at = float("-inf")  # time.monotonic() of the last line
        self._elapsed = TimeElapsedColumn()
        self._remaining = TimeRemainingColumn()
        if enabled and bar:
            self._progress = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]}"),
                TextColumn("ETA"),
                self._remaining,
                self._elapsed,
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
        self._at = self._shown = first
        if not self.live:  # the task still keeps time and speed; nothing is drawn
            try:
                yield self
            finally:
                if self._at > self._shown:  # the last step, as a stopping bar shows it
                    self._line()
            return
        self._progress.start()
        try:
            yield self
        finally:
            self._progress.stop()

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Show step ``step`` done; ``tokens_per_s`` is the run's so far (``TrainResult``)."""
        if self._progress is None:
            return
        self._progress.update(
            self._task, completed=step, loss=f"{loss:.4f}", tps=rate_text(tokens_per_s)
        )
        self._at = step
        first = self._printed_at == float("-inf")
        due = time.monotonic() - self._printed_at >= self.every_s
        if not self.live and (first or due or step == self._total):
            self._line()

    def _line(self) -> None:
        """One plain line of the task as it stands (lines only)."""
        assert self._progress is not None
        task = self._progress.tasks[0]
        self.console.print(
            f"step {self._at}/{self._total}  loss {task.fields['loss']}  {task.fields['tps']}  "
            f"elapsed {self._elapsed.render(task).plain}  "
            f"ETA {self._remaining.render(task).plain}",
            markup=False,
            highlight=False,
        )
        self._shown = self._at
        self._printed_at = time.monotonic()

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
