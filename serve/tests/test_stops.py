"""Stop strings on decoded byte text: found across tokens and split characters, never shown."""

from __future__ import annotations

import pytest

from niels_gpt_serve.stops import StopText


def run(stops: list[str], text: str) -> tuple[list[str], str, bool]:
    """Every piece ``feed`` returned (then ``finish``), their join, and ``stopped``."""
    cut = StopText(stops)
    pieces = [cut.feed(b) for b in text.encode()]
    pieces.append(cut.finish())
    return pieces, "".join(pieces), cut.stopped


@pytest.mark.parametrize(
    ("stops", "text", "want", "stopped"),
    [
        ([], "plain é text", "plain é text", False),
        (["\n\n"], "a\nb\n\nc", "a\nb", True),
        (["é"], "caféx", "caf", True),  # a two-byte stop, split across tokens
        (["yq", "xyq"], "axyq", "a", True),  # the earliest stop wins, not the first listed
        (["return"], "retur", "retur", False),  # held back, then flushed at the end
    ],
)
def test_text_ends_before_the_first_stop(
    stops: list[str], text: str, want: str, stopped: bool
) -> None:
    _, got, did = run(stops, text)
    assert (got, did) == (want, stopped)


def test_a_prefix_of_a_stop_is_held_back_until_it_is_decided() -> None:
    pieces, got, _ = run(["END"], "abEND")
    assert got == "ab" and pieces[:3] == ["a", "b", ""]  # "E" could begin "END"
    pieces, got, _ = run(["END"], "abEx")
    assert got == "abEx" and pieces[2] == "" and pieces[3] == "Ex"


def test_a_character_split_across_bytes_waits_for_its_last_byte() -> None:
    pieces, got, _ = run([], "é")
    assert pieces == ["", "é", ""] and got == "é"
