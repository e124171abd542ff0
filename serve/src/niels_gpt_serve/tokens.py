"""Byte-level tokens: text to ids and ids to what a page may show.

The models ``niels-train`` writes have ``V = 256``: a token is one byte of
the UTF-8 text. A byte is shown as its character when it is printable ASCII;
every other byte as an escape (``\\n``, ``\\t``, ``\\x1b``), so a sampled byte
can never act as markup or a control character, and a multi-byte character
shows as its bytes (``\\xc3\\xa9`` for ``é``), one a token.
"""

from __future__ import annotations

from collections.abc import Sequence

from niels_gpt_experiments.sampling import printable

__all__ = ["byte_label", "decode", "encode", "labels"]

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x5C: "\\\\"}


def encode(text: str) -> list[int]:
    """The token ids of ``text``: its UTF-8 bytes, each in ``[0, 256)``."""
    return list(text.encode("utf-8"))


def byte_label(token: int) -> str:
    """How one byte token is shown: printable ASCII as itself, anything else escaped.

    Raises:
        ValueError: ``token`` outside ``[0, 256)``.
    """
    if not 0 <= token < 256:
        raise ValueError(f"a byte token must be in [0, 255], got {token}")
    if token in _NAMED:
        return _NAMED[token]
    if 0x20 <= token < 0x7F:
        return chr(token)
    return f"\\x{token:02x}"


def labels(tokens: Sequence[int]) -> list[str]:
    """``byte_label`` of every token."""
    return [byte_label(t) for t in tokens]


def decode(tokens: Sequence[int]) -> str:
    """The text of byte tokens for reading (``niels-train``'s ``printable``): UTF-8
    where it decodes; other control characters and invalid bytes as escapes."""
    return printable(bytes(tokens))
