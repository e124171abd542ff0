"""The request body of ``POST /v1/completions`` (OpenAI's legacy completions protocol).

Fields the protocol has and this server does not honour are refused unless
they hold their neutral value (penalties 0, ``best_of`` equal to ``n``), so a
client never believes a knob took effect when it did not. Types are strict,
as on the page's API (``schemas.py``): ``"8"``, ``8.0`` and ``true`` are not
integers (a ``seed`` may be an exact decimal string, on both APIs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from niels_gpt_serve.schemas import GREEDY_BELOW, MAX_SEED, Sampled, unicode_text

__all__ = ["ChatRequest", "CompletionRequest", "Message", "StreamOptions"]

MAX_N = 16
MAX_STOPS = 4
MAX_LOGPROBS = 5
#: OpenAI's range of ``temperature`` is [0, 2].
MAX_OPENAI_TEMPERATURE = 2.0


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(Sampled):
    """``prompt`` continued ``n`` times, up to ``max_tokens`` bytes each."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="The id from GET /v1/models.")
    prompt: str | list[str] = Field(description="A prompt, or a list: n choices for each.")
    max_tokens: int | None = Field(
        default=16, ge=0,
        description="New tokens (bytes) at most; null: as many as the server's "
        "--max-new-tokens and the model's context leave room for.",
    )  # fmt: skip
    temperature: float = Field(
        default=1.0, ge=0.0, le=MAX_OPENAI_TEMPERATURE, allow_inf_nan=False,
        description=f"Below {GREEDY_BELOW} (0 included): greedy; otherwise it divides the logits.",
    )  # fmt: skip
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=MAX_N, description="Choices for each prompt.")
    stop: str | list[str] | None = Field(
        default=None, description=f"Up to {MAX_STOPS} strings; the text ends before the first."
    )
    seed: int | None = Field(
        default=None, ge=0, le=MAX_SEED,
        description="Choice i of a prompt draws with seed + i; null: the server picks one.",
    )  # fmt: skip
    logprobs: int | None = Field(
        default=None, ge=0, le=MAX_LOGPROBS,
        description="Log-probabilities (of the model's raw softmax) of each token and the "
        "likeliest alternatives.",
    )  # fmt: skip
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = Field(default=False, description="The prompt before each choice's text.")
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        many = [value] if isinstance(value, str) else value or []
        if len(many) > MAX_STOPS or any(not s for s in many):
            raise ValueError(f"must be at most {MAX_STOPS} non-empty strings")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def no_penalty(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported: must be 0")
        return value

    @field_validator("prompt")
    @classmethod
    def prompts(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("must be a string or a non-empty list of strings")
        return value


class TextPart(BaseModel):
    """A part of a message's content: only text (this model reads bytes of text)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message; ``content`` a string or a list of text parts. (No ``name``: the
    plain template has no place for one, and a field is never ignored silently.)"""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(Sampled):
    """``messages`` in the plain chat template (``chat.py``), continued ``n`` times."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="The id from GET /v1/models.")
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0, description="As /v1/completions'.")
    max_completion_tokens: int | None = Field(
        default=None, ge=0, description="The newer name of max_tokens; give one or neither."
    )
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_OPENAI_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None

    _stops = field_validator("stop")(CompletionRequest.stops.__func__)  # type: ignore[attr-defined]
    _penalties = field_validator("presence_penalty", "frequency_penalty")(
        CompletionRequest.no_penalty.__func__  # type: ignore[attr-defined]
    )

    @field_validator("messages")
    @classmethod
    def messages_are_unicode(cls, value: list[Message]) -> list[Message]:
        for message in value:
            unicode_text(message.text())
        return value
