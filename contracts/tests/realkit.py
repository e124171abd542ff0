"""A scenario repository made of the real stages, for ``contracts pr`` end to end.

The packages' sources, the specs (with their oracle drivers and runtime
drivers), the root ``conftest.py``, pytest settings and constraints are copied
from this checkout as they are. Two things are cut down so that a verdict
takes seconds, not the ten minutes of the full suites:

- each stage's tests become one small file (``TESTS``) that claims every
  invariant of the stage and checks it against a float64 computation;
  the acceptance tests are left out;
- each spec keeps only the mutants ``KEEP_MUTANTS`` names (the tiny tests kill
  them), so the weakened-test scenarios have something to measure.

The oracle, its drivers, the runtime rules, the source rules and the sandbox
are the real ones: that is what these scenarios judge.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib
from gatekit import Repo

from niels_gpt_contracts.cli import main
from niels_gpt_contracts.reporters import text
from niels_gpt_contracts.result import Outcome, Result, Violation

LOG = "CONTRACTS_SCENARIO_LOG"  # a folder: each verdict's text report is written there

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("core", "rope", "attention", "block", "backbone_v1", "fastpath", "kv_cache", "padding")
# kv_cache's mutant must break the cached path only: its test compares cached chunks with
# the uncached forward, and a bug in the one attention shared by both (1/D) cancels out.
KEEP_MUTANTS = {"attention": ("no-scale",), "kv_cache": ("chunk-mask-not-offset",),
                "padding": ("key-mask-missing",)}  # fmt: skip

CORE = """\
import pytest

from niels_gpt.config import ModelConfig


def test_core():
    assert ModelConfig(V=3).T == 1024
    with pytest.raises(ValueError):
        ModelConfig(V=3, C=10, H=4)
"""
ROPE = """\
import torch

import niels_gpt.model.rope as rope


def test_rope():
    sin, cos = rope.rope_cache(9, 4, theta=100.0, dtype=torch.float64)
    q = torch.randn(1, 1, 9, 4, dtype=torch.float64)
    got, _ = rope.apply_rope(q, q, sin, cos)
    ang = torch.arange(9.0, dtype=torch.float64)[:, None] * 100.0 ** (-torch.arange(0, 4, 2) / 4)
    a, b = q[..., 0::2], q[..., 1::2]
    want = torch.stack((a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()), -1)
    torch.testing.assert_close(got, want.flatten(-2), rtol=1e-6, atol=1e-6)
"""
ATTENTION = """\
import math

import torch

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention


def test_attention():
    torch.manual_seed(0)
    cfg = ModelConfig(V=2, T=12, C=8, H=2, dropout=0.0)
    attn = CausalSelfAttention(cfg).double().eval()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    y, probs = attn(x, return_attn=True)
    q, k, v = (t.view(2, 10, 2, 4).transpose(1, 2) for t in attn.qkv(x).split(8, -1))
    q, k = rope.apply_rope(q, k, attn.rope_sin, attn.rope_cos)  # the module's float64 tables
    s = (q @ k.transpose(-2, -1) / math.sqrt(4)).masked_fill(
        torch.ones(10, 10, dtype=torch.bool).triu(1), -math.inf
    )
    want = attn.proj((s.softmax(-1) @ v).transpose(1, 2).reshape(2, 10, 8))
    torch.testing.assert_close(y, want, rtol=1e-9, atol=1e-9)
    assert float(probs.detach().triu(1).abs().max()) == 0.0
    with torch.no_grad():
        torch.testing.assert_close(attn(x), want.detach(), rtol=1e-9, atol=1e-9)
"""
QUANT = """\
import torch

from niels_gpt.model.quant import quantize_linear, quantize_weight


def test_quant():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 24).double()
    q, s = quantize_weight(linear.weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    error = (q.double() * s[:, None] - linear.weight.detach()).abs()
    assert bool((error <= s[:, None] / 2).all())
    layer = quantize_linear(linear)
    x = torch.randn(3, 64, dtype=torch.float64)
    want = torch.nn.functional.linear(x, layer.dequantize(), layer.bias)
    torch.testing.assert_close(layer(x), want, rtol=1e-10, atol=1e-10)
"""
MODEL = """\
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
{extra}

def _gpt():
    torch.manual_seed(0)
    return GPT(ModelConfig(V=11, T=16, C=8, H=2, L=2, d_ff=16, dropout=0.0)).double().eval()


def test_{stage}():
    gpt = _gpt()
    ids = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
{body}
"""
BODIES = {
    "block": ("from niels_gpt.model.block_v0 import Block\n",
              "        b = Block(gpt.cfg).double().eval()\n"
              "        x = torch.randn(1, 6, 8, dtype=torch.float64)\n"
              "        y = b(x)\n        x[:, 4:] = 9.0\n"
              "        torch.testing.assert_close(b(x)[:, :4], y[:, :4], rtol=1e-12, atol=1e-12)"),
    "backbone_v1": ("", "        full = gpt(ids)\n        ids[:, 5:] = 3\n"
                        "        torch.testing.assert_close(gpt(ids)[:, :5], full[:, :5], "
                        "rtol=1e-12, atol=1e-12)"),
    "fastpath": ("from niels_gpt.model.fastpath import use_fast_attention\n",
                 "        want = gpt(ids)\n        use_fast_attention(gpt)\n"
                 "        torch.testing.assert_close(gpt(ids), want, rtol=1e-9, atol=1e-9)"),
    "kv_cache": ("from niels_gpt.model.kv_cache import drop_kv_cache, use_kv_cache\n",
                 "        want = gpt(ids)\n        use_kv_cache(gpt, 2)\n"
                 "        parts = [gpt(ids[:, :4]), gpt(ids[:, 4:7]), gpt(ids[:, 7:])]\n"
                 "        got = torch.cat(parts, 1)\n"
                 "        drop_kv_cache(gpt)\n"
                 "        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)"),
    "padding": ("from niels_gpt.model.padding import padded_forward\n",
                "        mask = torch.ones(2, 9, dtype=torch.bool)\n        mask[1, :3] = False\n"
                "        got = padded_forward(gpt, ids, mask)\n"
                "        alone = gpt(ids[1:, 3:])\n"
                "        torch.testing.assert_close(got[1:, 3:], alone, rtol=1e-9, atol=1e-9)\n"
                "        assert float(got[1, :3].abs().max()) == 0.0"),
}  # fmt: skip


def test_text(stage: str, spec: dict[str, Any]) -> str:
    """The stage's one test, claiming every invariant of its spec."""
    marks = "".join(f'@pytest.mark.invariant("{stage}.{i["id"]}")\n' for i in spec["invariants"])
    if stage in BODIES:
        extra, body = BODIES[stage]
        text = MODEL.format(stage=stage, extra=extra, body=body)
    else:
        text = {"core": CORE, "rope": ROPE, "attention": ATTENTION, "quant": QUANT}[stage]
    head, _, tail = text.partition(f"\ndef test_{stage}(")
    return "import pytest\n" + head + "\n" + marks + f"def test_{stage}(" + tail


def strip_mutants(text: str, keep: tuple[str, ...]) -> str:
    """The spec's text without its [[mutants]] tables, but those whose id ``keep`` names."""
    out: list[str] = []
    block: list[str] | None = None
    quoted = False
    for line in text.splitlines(keepends=True):
        starts_table = not quoted and line.startswith("[")
        if starts_table and block is not None:
            ident = re.search(r'^id = "([^"]+)"', "".join(block), re.MULTILINE)
            if ident and ident.group(1) in keep:
                out += block
            block = None
        if starts_table and line.strip() == "[[mutants]]":
            block = [line]
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
        quoted ^= line.count('"""') % 2 == 1
    if block is not None:
        ident = re.search(r'^id = "([^"]+)"', "".join(block), re.MULTILINE)
        if ident and ident.group(1) in keep:
            out += block
    return "".join(out)


def _tracked() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "specs", "packages"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def add_stage(repo: Repo, stage: str) -> None:
    """Write the stage's package (sources, pyproject) from this checkout and its one test."""
    for rel in _tracked():
        if rel.startswith(f"packages/{stage}/") and "/tests/" not in rel and (ROOT / rel).is_file():
            (repo.root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, repo.root / rel)
    spec = tomllib.loads((ROOT / "specs" / f"{stage}.toml").read_text(encoding="utf-8"))
    repo.write(f"packages/{stage}/tests/test_{stage}.py", test_text(stage, spec))


def make_real_repo(root: Path, present: tuple[str, ...] = STAGES) -> Repo:
    """The scenario repository on ``main``, one commit (see the module docstring).

    Stages not in ``present`` are pending: their specs landed, their packages not.
    """
    repo = Repo(root)
    root.mkdir(parents=True)
    repo.git("init", "-q", "-b", "main")
    for key, value in (("user.name", "Maintainer"), ("user.email", "m@example.com")):
        repo.git("config", key, value)
    repo.git("config", "commit.gpgsign", "false")
    for rel in _tracked():
        if "/tests/" in rel or not (ROOT / rel).is_file() or rel.startswith("packages/"):
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    for name in ("conftest.py", "pyproject.toml", "constraints.txt"):
        shutil.copyfile(ROOT / name, root / name)
    repo.write("README.md", "# scenario\n")
    for stage in STAGES:
        text = (ROOT / "specs" / f"{stage}.toml").read_text(encoding="utf-8")
        repo.write(f"specs/{stage}.toml", strip_mutants(text, KEEP_MUTANTS.get(stage, ())))
        if stage in present:
            add_stage(repo, stage)
    repo.commit("the real stages, tests cut down")
    return repo


class RealRepo(Repo):
    """A copy of the scenario repository on a PR branch; ``verdict`` runs ``contracts pr``
    with ``--full``: every row, so a scenario shows what each check saw (the tests fooled,
    the oracle not), not only the first BROKEN one."""

    def __init__(self, root: Path, cache: Path) -> None:
        super().__init__(root)
        self.cache = cache

    def pr(self, stage: str, message: str = "change") -> str:
        return self.commit(f"{message}\n\nStage: {stage}")

    def verdict(self, *extra: str) -> tuple[int, dict[str, Any], str]:
        return self._verdict("--full", *extra)

    def verdict_stopping(self, *extra: str) -> tuple[int, dict[str, Any], str]:
        """``verdict`` without ``--full``: the rows up to the first BROKEN one."""
        return self._verdict(*extra)

    def _verdict(self, *extra: str) -> tuple[int, dict[str, Any], str]:
        out, err = io.StringIO(), io.StringIO()
        args = [
            "pr", "--repo", str(self.root), "--base", "main", "--head", "HEAD",
            "--python", sys.executable, "--cache-dir", str(self.cache), "--jobs", "1",
            "--format", "json", *extra,
        ]  # fmt: skip
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
        assert code != 2, f"no verdict: {err.getvalue()[-3000:]}"
        payload = json.loads(out.getvalue()) if out.getvalue() else {}
        if os.environ.get(LOG):
            name = os.environ.get("PYTEST_CURRENT_TEST", "verdict").split(" ")[0]
            target = Path(os.environ[LOG]) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".txt")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("\n".join(text_lines(payload)) + "\n", encoding="utf-8")
        return code, payload, err.getvalue()

    def probe(self, code: str, rev: str = "HEAD") -> str:
        """Run ``code`` (Python) on the stage sources of ``rev``, outside the gate; its stdout."""
        tree = self.root.parent / f"probe-{rev.replace('/', '_')}"
        shutil.rmtree(tree, ignore_errors=True)
        self.git("worktree", "add", "-q", "-f", "--detach", str(tree), rev)
        try:
            path = [str(p) for p in sorted(tree.glob("packages/*/src"))]
            # Only this tree's stages: drop the checkout's editable installs.
            only = f"import sys\nsys.path[:] = [p for p in sys.path if p in {path!r} or "
            only += "'/packages/' not in p]\n"
            done = subprocess.run(
                [sys.executable, "-c", only + code],
                env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
        finally:
            self.git("worktree", "remove", "-f", str(tree))
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout


def rows(payload: dict[str, Any]) -> dict[str, str]:
    """``check -> status`` of a JSON verdict."""
    return {o["check"]: o["status"] for o in payload.get("outcomes", [])}


def rules_of(payload: dict[str, Any]) -> set[str]:
    return {v["rule"] for v in payload.get("violations", [])}


def text_lines(payload: dict[str, Any]) -> list[str]:
    """The verdict as ``--format text`` prints it, rebuilt from its JSON report."""
    result = Result(
        mode=payload["mode"],
        stages=list(payload["stages"]),
        base=payload.get("base"),
        head=payload.get("head"),
        merge_base=payload.get("merge_base"),
        changed_paths=payload.get("changed_paths"),
    )
    for o in payload["outcomes"]:
        found = [
            Violation(**v)
            for v in payload["violations"]
            if (v["stage"], v["check"]) == (o["stage"], o["check"])
        ]
        result.outcomes.append(Outcome(o["stage"], o["check"], o["status"], o["summary"], found))
    return text.lines(result)
