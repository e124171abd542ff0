"""The request body of ``POST /v1/completions`` (OpenAI's legacy completions protocol).

Fields the protocol has and this server does not honour are refused unless
they hold their neutral value (``echo: false``, penalties 0, ``best_of``
equal to ``n``), so a client never believes a knob took effect when it did not.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from niels_gpt_serve.schemas import MAX_SEED, MAX_TEMPERATURE, Sampled

__all__ = ["CompletionRequest", "StreamOptions"]

MAX_N = 16
MAX_STOPS = 4
MAX_LOGPROBS = 5


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(Sampled):
    """``prompt`` continued ``n`` times, up to ``max_tokens`` bytes each."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The id from GET /v1/models.")
    prompt: str | list[str] = Field(description="A prompt, or a list: n choices for each.")
    max_tokens: int = Field(default=16, ge=0, description="New tokens (bytes) at most.")
    temperature: float = Field(default=1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
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
    echo: bool = False
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

    @field_validator("echo")
    @classmethod
    def no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported: must be false")
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
