"""The plain chat template: chat messages as the bytes of text this model continues.

The served models read and write bytes of plain text; none was trained on
conversations, so there is no special token to mark a turn. A conversation
is written as a transcript, one turn a paragraph, and the model continues
after the last ``Assistant:``::

    <system text>            (each system or developer message, as it is)

    User: <text>

    Assistant: <text>

    User: <text>

    Assistant:

Turns are joined by a blank line (``"\\n\\n"``); the prompt ends with
``"Assistant:"`` and one space. The reply ends at ``"\\nUser:"`` (``STOP``,
not included) if the model writes one, otherwise at ``max_tokens``. A trained
Python-code model will reply in Python-like text: the template is a way in
for chat clients, not a chat model.
"""

from __future__ import annotations

from collections.abc import Sequence

from niels_gpt_serve.openai_schemas import Message

__all__ = ["STOP", "render"]

#: The stop string every chat completion has, beside the client's own.
STOP = "\nUser:"
_SPEAKER = {"user": "User: ", "assistant": "Assistant: ", "system": "", "developer": ""}


def render(messages: Sequence[Message]) -> str:
    """The prompt of ``messages`` (see the module docstring)."""
    turns = [_SPEAKER[m.role] + m.text() for m in messages]
    return "\n\n".join([*turns, "Assistant: "])
