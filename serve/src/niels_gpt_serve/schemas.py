"""The API's request and response bodies (pydantic), with their static limits.

Requests are strict: a field of the wrong JSON type is an error, never
converted (``"5"`` is not an int, ``true`` is not a number), and an unknown
field is an error naming it, so a misspelt knob cannot be ignored silently.
Limits that depend on the loaded model (its context ``T``, its vocabulary
``V``, the server's ``--max-new-tokens``) are checked in ``limits.py``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "AttentionRequest",
    "AttentionResponse",
    "GenerateRequest",
    "GenerateResponse",
    "ModelInfo",
    "TokenEvent",
    "TrainingInfo",
]

MAX_SEED = 2**63 - 1
MAX_TEMPERATURE = 100.0
#: Temperatures below this are greedy, as 0 is (vLLM's rule, its ``_SAMPLING_EPS``):
#: logits / T would overflow float32 for the tiniest (1e-39 made the draw NaN), and
#: any T this small puts all the mass on the maximum anyway.
GREEDY_BELOW = 1e-5
_DECIMAL = re.compile(r"[0-9]{1,19}")


def unicode_text(text: str) -> str:
    """``text`` if it has UTF-8 bytes; ValueError naming a lone surrogate if it has none.

    JSON may carry ``"\\ud800"``, a half of a surrogate pair, which no UTF-8 encodes.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"must be valid Unicode text: character {err.start} is a lone surrogate "
            f"U+{ord(text[err.start]):04X}, which has no UTF-8 bytes"
        ) from None
    return text


class Sampled(BaseModel):
    """What every sampling request checks the same way: its ``prompt`` text and ``seed``.

    A base for request models that declare both fields (the native and the
    OpenAI-compatible one), so their rules and messages cannot drift apart.
    A temperature below ``GREEDY_BELOW`` is taken, and is greedy (``sampling.choose``).
    """

    @field_validator("prompt", mode="before", check_fields=False)
    @classmethod
    def prompt_is_unicode(cls, value: object) -> object:
        """Every prompt string with UTF-8 bytes (``unicode_text``), before its type is
        checked, so the error names the surrogate; anything else is left to the type."""
        for text in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if isinstance(text, str):
                unicode_text(text)
        return value

    @field_validator("seed", mode="before", check_fields=False)
    @classmethod
    def seed_from_text(cls, value: object) -> object:
        """A seed sent as an exact decimal string (``"6548027008821095176"``: JavaScript
        cannot hold 64-bit integers in its numbers) as that int; anything else unchanged."""
        if isinstance(value, str):
            if not _DECIMAL.fullmatch(value):
                raise ValueError(f"must be an integer in [0, {MAX_SEED}] or its decimal string")
            return int(value)
        return value


MAX_PROMPT_CHARS = 16_384  # before the model's own limit, which is in tokens (bytes)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GenerateRequest(Sampled, _Strict):
    """Generate up to ``max_new_tokens`` bytes after ``prompt``."""

    prompt: str = Field(
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="Text to continue; its UTF-8 bytes are the prompt tokens "
        "(at most the model's context T - 1 of them).",
    )
    max_new_tokens: int = Field(
        default=64,
        ge=0,
        description="Tokens to generate; prompt + max_new_tokens <= the model's T, "
        "and at most the server's --max-new-tokens.",
    )
    temperature: float = Field(
        default=1.0,
        ge=0.0,
        le=MAX_TEMPERATURE,
        allow_inf_nan=False,
        description=f"Below {GREEDY_BELOW} (0 included): greedy (the first maximum, no "
        f"draw); otherwise it divides the logits. At most {MAX_TEMPERATURE}.",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="Keep the k largest logits (ties kept); k <= V."
    )
    top_p: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Keep the shortest most-probable set whose mass reaches p.",
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SEED,
        description="Seed of this request's own torch.Generator; null: the server picks "
        "one and returns it. The same seed and knobs give the same tokens, batched or alone. "
        "An exact decimal string is taken too (for clients whose numbers are doubles).",
    )
    eos: int | None = Field(
        default=None,
        ge=0,
        description="Stop after this token id (a byte, < V) is generated; it is included.",
    )


class GenerateResponse(BaseModel):
    """A finished generation."""

    prompt_tokens: list[int] = Field(description="The prompt's token ids (its UTF-8 bytes).")
    tokens: list[int] = Field(description="The generated token ids, in order.")
    labels: list[str] = Field(
        description="How each of prompt_tokens + tokens is shown: printable ASCII as "
        "itself, any other byte escaped (\\n, \\x1b)."
    )
    text: str = Field(description="The generated bytes as text, undecodable bytes escaped.")
    finish_reason: Literal["length", "eos"]
    seed: int = Field(description="The seed the request's generator used.")
    seed_text: str = Field(description="The same seed as an exact decimal string.")
    queued_ms: float = Field(description="Time from arrival to the first token.")
    total_ms: float = Field(description="Time from arrival to the last token.")


class TokenEvent(BaseModel):
    """One streamed token (``event: token`` of ``/api/generate/stream``)."""

    index: int
    token: int
    label: str


class AttentionRequest(_Strict):
    """The attention of a token sequence (e.g. a finished generation's prompt + tokens)."""

    tokens: list[int] = Field(
        min_length=1, description="Token ids in [0, V), at most the model's T of them."
    )
    layer: int | None = Field(default=None, ge=0, description="One layer; null: every layer.")
    head: int | None = Field(default=None, ge=0, description="One head; null: every head.")


class AttentionResponse(BaseModel):
    """``attention[i][j][q][k]``: how much query ``q`` attends to key ``k`` in layer
    ``layers[i]``, head ``heads[j]`` (post-softmax, pre-dropout; 0 for ``k > q``)."""

    tokens: list[int]
    labels: list[str]
    layers: list[int]
    heads: list[int]
    attention: list[list[list[list[float]]]]


class TrainingInfo(BaseModel):
    """How trained the served checkpoint is, as its run folder records it (``trained.py``)."""

    steps: int | None = Field(description="The steps its run planned (run.json), if known.")
    val_loss: float | None = Field(
        description="Validation loss in nats a byte (metrics.jsonl), if measured."
    )
    val_step: int | None = Field(description="The step val_loss was measured at.")
    tokens: int | None = Field(description="Training tokens seen by the served step, if known.")
    barely_trained: bool = Field(description="No val_loss, or one above the page's threshold.")
    summary: str = Field(description="One sentence for the page saying all of the above.")


class ModelInfo(BaseModel):
    """What is being served, how trained it is, and the limits of a request."""

    arch: str
    run: str
    step: int
    params: int
    V: int
    T: int
    C: int
    L: int
    H: int
    H_kv: int  # key/value heads; H unless the model uses grouped-query attention
    d_ff: int
    engine: str
    training: TrainingInfo
    max_new_tokens: int = Field(description="The server's cap on max_new_tokens.")
    max_prompt_tokens: int
    max_batch: int
    max_body_bytes: int
