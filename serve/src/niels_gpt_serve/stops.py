"""Stop strings, matched on the decoded text of a byte-level generation.

Bytes become text through an incremental UTF-8 decoder (a character split
across tokens waits for its last byte; invalid bytes become U+FFFD), and a
stop string is looked for in that text, as ``/v1/completions`` promises: the
answer ends before the first stop string, which is not included. While a
stream runs, the tail that could still begin a stop string is held back, so a
client never sees text that a stop string later cuts off.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["StopText"]


class StopText:
    """Feed byte tokens one by one; ``feed`` returns the text now safe to show."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""  # everything decoded so far
        self.shown = 0  # characters of text already returned
        self.stopped = False
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def _hold(self) -> int:
        """How many trailing characters could still begin a stop string."""
        for n in range(
            min(len(self.text), max((len(s) for s in self.stops), default=1) - 1), 0, -1
        ):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def feed(self, token: int) -> str:
        """The new text after ``token`` (a byte); sets ``stopped`` once a stop string appears."""
        if self.stopped:
            return ""
        start = max(0, self.shown - max((len(s) for s in self.stops), default=0))
        self.text += self._decoder.decode(bytes([token]))
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            self.text = self.text[: min(found)]
            return self._take(len(self.text))
        return self._take(len(self.text) - self._hold())

    def finish(self) -> str:
        """The rest once the generation ended without a stop string."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        piece = self.text[self.shown : max(end, self.shown)]
        self.shown += len(piece)
        return piece
