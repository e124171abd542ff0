"""Limits that depend on the loaded model and the server's flags, and the error they raise.

``schemas.py`` checks what a request can be checked against alone (types,
ranges that hold for any model); here the rest: the prompt must fit the
model's context with room for the new tokens, ``top_k`` and ``eos`` must fit
the vocabulary, a layer or head must exist. Each failure is a ``FieldError``
naming the request field, which the app answers with a 4xx JSON body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from niels_gpt.config import ModelConfig
from niels_gpt_serve.schemas import AttentionRequest, GenerateRequest
from niels_gpt_serve.tokens import encode

__all__ = ["FieldError", "Limits", "check_attention", "check_generate"]


class FieldError(ValueError):
    """A request field with a value the server cannot take (HTTP ``status``; ``code``
    names the kind of error in the answer)."""

    def __init__(self, field: str, message: str, status: int = 422, code: str = "limit") -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status, self.code = field, message, status, code


@dataclass(frozen=True)
class Limits:
    """The server's limits: ``max_new_tokens`` a request, bytes of a request body,
    requests decoded together and waiting."""

    max_new_tokens: int = 256
    max_body_bytes: int = 65_536
    max_batch: int = 16
    max_waiting: int = 256

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_body_bytes", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


def check_generate(req: GenerateRequest, cfg: ModelConfig, limits: Limits) -> list[int]:
    """The prompt's tokens, once every model-dependent limit holds.

    Raises:
        FieldError: the prompt is longer than ``T - 1`` tokens, prompt plus
            ``max_new_tokens`` exceeds ``T``, ``max_new_tokens`` exceeds the
            server's cap, ``top_k > V`` or ``eos >= V``.
    """
    prompt = encode(req.prompt)
    if len(prompt) > cfg.T - 1:
        raise FieldError(
            "prompt",
            f"must be at most {cfg.T - 1} tokens (UTF-8 bytes; the model's context is "
            f"T={cfg.T}), got {len(prompt)}",
        )
    room = cfg.T - len(prompt)
    if req.max_new_tokens > limits.max_new_tokens and limits.max_new_tokens <= room:
        raise FieldError(
            "max_new_tokens",
            f"must be <= {limits.max_new_tokens} (the server's limit), got {req.max_new_tokens}",
        )
    if req.max_new_tokens > room:  # the smaller of the two limits is the one named
        raise FieldError(
            "max_new_tokens",
            f"must be <= {room}: the prompt's {len(prompt)} tokens + max_new_tokens must fit "
            f"the model's context T={cfg.T}, got {req.max_new_tokens}",
        )
    if req.top_k is not None and req.top_k > cfg.V:
        raise FieldError("top_k", f"must be <= V={cfg.V} or null, got {req.top_k}")
    if req.eos is not None and req.eos >= cfg.V:
        raise FieldError("eos", f"must be a token id in [0, {cfg.V - 1}] or null, got {req.eos}")
    return prompt


def _index(value: int | None, count: int, field: str) -> list[int]:
    if value is None:
        return list(range(count))
    if value >= count:
        raise FieldError(field, f"must be in [0, {count - 1}] or null, got {value}")
    return [value]


def check_attention(req: AttentionRequest, cfg: ModelConfig) -> tuple[list[int], list[int]]:
    """The layers and heads asked for, once the tokens fit the model.

    Raises:
        FieldError: more than ``T`` tokens, a token outside ``[0, V)``, or a
            layer or head the model does not have.
    """
    tokens: Sequence[int] = req.tokens
    if len(tokens) > cfg.T:
        raise FieldError("tokens", f"must be at most T={cfg.T} token ids, got {len(tokens)}")
    bad = [t for t in tokens if not 0 <= t < cfg.V]
    if bad:
        raise FieldError("tokens", f"must be ids in [0, {cfg.V - 1}], got {bad[0]}")
    return _index(req.layer, cfg.L, "layer"), _index(req.head, cfg.H, "head")
