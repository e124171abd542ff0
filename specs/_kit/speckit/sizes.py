"""The oracle's ``size`` axis: each shape-polymorphic call at a real model's sizes.

The drivers' other calls draw small tensors (weights of 48 to 96 rows,
sequences of a few hundred positions, vocabularies of a few hundred), so code
that takes another path past a size (a weight quantized in pieces above some
row count, a table built otherwise past a length, a vocabulary sorted in
chunks) is never judged on it. ``real_sizes`` gives two sizes for each such
call, one call each, no grid:

- ``GPT2_SMALL``: the sizes a user meets first, GPT-2 small's: width
  ``C = 768``, the attention's fused projection of ``3 C = 2304`` rows and the
  MLP's of ``4 C = 3072`` rows, ``T = 1024`` positions, ``H = 12`` heads of
  ``D = 64``, a vocabulary of ``V = 50257``;
- one draw from the verdict's secret seed over a wide range (``WIDE``: each
  field uniform in its bounds, so a PR cannot know which sizes are judged,
  and most draws are large): widths that are and are not multiples of 32,
  row counts past every threshold up to 4096, lengths up to 2048, head dims up
  to 128, vocabularies up to 131072 (Llama 3's is 128256).

The bounds keep each call well under a second on one CPU core (a 4096 x
2048 weight, or ``B H T D`` up to 16 * 2048 * 128 floats, at most). It imports the
standard library only (the draws come from ``o.rng``, a ``random.Random``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


@dataclass(frozen=True)
class Size:
    """One set of sizes a driver takes what it needs from.

    ``name``: ``"gpt2"`` or ``"wide"`` (the call's name says which); ``C``: a
    width (a weight's input features); ``rows``: the output features of the
    weights judged, each a call; ``T``: positions; ``H`` heads of ``D`` (even)
    features each; ``V``: a vocabulary.
    """

    name: str
    C: int
    rows: tuple[int, ...]
    T: int
    H: int
    D: int
    V: int

    def __str__(self) -> str:
        rows = ",".join(map(str, self.rows))
        return f"{self.name} C={self.C} rows={rows} T={self.T} H={self.H} D={self.D} V={self.V}"


GPT2_SMALL = Size(name="gpt2", C=768, rows=(3 * 768, 4 * 768), T=1024, H=12, D=64, V=50257)

# Each field's inclusive bounds for the secret-seeded draw (D: an even number in them).
WIDE = {
    "C": (1, 2048),
    "rows": (1, 4096),
    "T": (1, 2048),
    "H": (1, 16),
    "D": (2, 128),
    "V": (2, 131072),
}


def wide_size(o: Oracle, tag: str) -> Size:
    """Sizes drawn from ``WIDE`` with ``o.rng(tag)`` (the same on both sides of a verdict)."""
    r = o.rng(tag)

    def draw(field: str) -> int:
        low, high = WIDE[field]
        return r.randint(low, high)

    rows = (draw("rows"), draw("rows"))
    return Size(
        name="wide",
        C=draw("C"),
        rows=rows,
        T=draw("T"),
        H=draw("H"),
        D=2 * (draw("D") // 2),
        V=draw("V"),
    )


def real_sizes(o: Oracle, tag: str) -> list[Size]:
    """``[GPT2_SMALL, wide_size(o, tag)]``: the two sizes every ``size`` call is made at."""
    return [GPT2_SMALL, wide_size(o, tag)]
