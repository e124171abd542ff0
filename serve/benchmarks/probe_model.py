"""Is the served model worth watching? Ask a running niels-serve, print what it says.

    python serve/benchmarks/probe_model.py http://127.0.0.1:8000

Prints the model's training line (from its run folder, through /api/model), the
greedy continuation of ``"The "``, two prompts continued with one seed, and for
every layer and head of the attention over one sentence of code: the share of a
token's attention on the token before it, on itself, on the first token, the
mean distance back, and the mean of each row's largest probability beside the
same mean for uniform rows (a head about uniform has the two close). A figure to
read, never a test: nothing is asserted.
"""

from __future__ import annotations

import sys

import httpx

TEXT = "    def __init__(self, name, value=None):\n        self.name = name\n        self."


def heads(http: httpx.Client, tokens: list[int]) -> None:
    got = http.post("/api/attention", json={"tokens": tokens}).json()
    t = len(tokens)
    rows = range(1, t)
    uniform = sum(1 / (q + 1) for q in rows) / (t - 1)
    print(f"attention over {t} tokens (rows 1..{t - 1}); uniform rows' mean largest: {uniform:.3f}")
    print("  layer head  prev   self  first  distance  mean largest")
    for i, layer in enumerate(got["layers"]):
        for j, head in enumerate(got["heads"]):
            m = got["attention"][i][j]
            prev = sum(m[q][q - 1] for q in rows) / (t - 1)
            own = sum(m[q][q] for q in rows) / (t - 1)
            first = sum(m[q][0] for q in rows) / (t - 1)
            far = sum(m[q][k] * (q - k) for q in rows for k in range(q + 1)) / (t - 1)
            top = sum(max(m[q][: q + 1]) for q in rows) / (t - 1)
            print(f"  {layer:5d} {head:4d}  {prev:.2f}  {own:5.2f}  {first:5.2f}  "
                  f"{far:8.1f}  {top:12.3f}")  # fmt: skip


def main(url: str) -> int:
    with httpx.Client(base_url=url, timeout=120) as http:
        info = http.get("/api/model").json()
        print(f"model: {info['arch']} run {info['run']}, step {info['step']}, "
              f"{info['params']:,} params, T={info['T']} C={info['C']} L={info['L']} "
              f"H={info['H']}")  # fmt: skip
        print(f"training: {info['training']['summary']}")
        greedy = {"prompt": "The ", "max_new_tokens": 48, "temperature": 0}
        print(f"greedy after 'The ': {http.post('/api/generate', json=greedy).json()['text']!r}")
        for prompt in ("def ", "import "):
            body = {"prompt": prompt, "max_new_tokens": 48, "temperature": 0.8, "seed": 7}
            text = http.post("/api/generate", json=body).json()["text"]
            print(f"seed 7, temperature 0.8, after {prompt!r}: {text!r}")
        heads(http, list(TEXT.encode()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"))
