"""niels-gpt-serve: a web page and an HTTP API on the niels_gpt stage wheels.

``niels-serve`` loads a ``niels-train`` run, generates text for concurrent
clients in one batch (the padding stage's left-padded forward, each request
with its own knobs and seed) and shows the attention the model used
(``GPT.forward_with_attn_trace``) as a heatmap over the tokens.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
