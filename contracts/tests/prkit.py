"""A small monorepo for ``contracts pr`` scenarios, judged end to end.

Stages (namespace ``ngt``), laid out like niels_gpt, each with a real spec,
real tests claiming real invariants, and the root ``conftest.py`` and pytest
settings a maintainer owns:

- ``core``: ``ngt.config.ModelConfig`` (``V`` defaults to 256, as before seed 004);
- ``rope``: ``ngt.model.rope.rotate`` (pure Python, one mutant);
- ``mixer``: ``ngt.model.mixer.mix`` (depends on core and rope, pure Python);
- ``backbone_v1``: ``ngt.model.gpt.forward`` (depends on mixer); like seed
  004 its PRs may change ``ngt/config.py`` (to make ``V`` required) and add
  ``V=`` to ``ModelConfig(...)`` calls in other stages' tests;
- ``attention``: ``ngt.model.attention.attend`` (torch), with a runtime
  rule forbidding fused attention kernels;
- ``fastpath``: ``ngt.model.fastpath.attend_fast`` (depends on attention,
  uses SDPA legitimately).

Only the attention scenarios import torch, so most scenarios take a second.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

from gatekit import SCHEMA, Repo, valid_report

from niels_gpt_contracts.cli import main

NO_SDPA_OPS = '["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_*"]'


def spec(
    stage: str,
    deps: list[str],
    modules: list[str],
    invariants: list[str],
    api: str,
    extra: str = "",
    forbidden: str = "",
    may: str = "",
) -> str:
    inv = "".join(f'\n[[invariants]]\nid = "{i}"\ntext = "The {i} property."\n' for i in invariants)
    quoted_deps = ", ".join(f'"{d}"' for d in deps)
    quoted_mods = ", ".join(f'"{m}"' for m in modules)
    no_rules = "" if "[[rules]]" in api else "rules = []\n"
    return f"""schema_version = 3
version = "1.0.0"
id = "{stage}"
title = "The {stage} stage"
package = "packages/{stage}"
distribution = "ngt-{stage}"
depends_on = [{quoted_deps}]
modules = [{quoted_mods}]
{no_rules}
[paths]
may_change = ["packages/{stage}/**", {may}]
must_not_change = [{forbidden}]
{extra}
{api}
{inv}"""


def _api(obj: str, signature: str, module: str, exports: list[str]) -> str:
    names = ", ".join(f'"{e}"' for e in exports)
    return (
        f'[[api]]\nobject = "{module}"\nkind = "module"\nexports = [{names}]\n\n'
        f'[[api]]\nobject = "{module}:{obj}"\nkind = "function"\nsignature = "{signature}"\n'
    )


CORE_MOD = """\
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    V: int = 256
    T: int = 8
"""

CORE_TEST = """\
import pytest

from ngt.config import ModelConfig


@pytest.mark.invariant("core.defaults")
def test_defaults():
    assert ModelConfig().T == 8


@pytest.mark.invariant("core.keeps_fields")
def test_keeps_fields():
    cfg = ModelConfig(T=4)
    assert (cfg.V, cfg.T) == (256, 4)
"""

ROPE_MOD = """\
from __future__ import annotations

__all__ = ["rotate"]


def rotate(xs: list[float], turns: int = 1) -> list[float]:
    if not xs:
        raise ValueError("rotate: expected a non-empty list, got []")
    n = turns % len(xs)
    return xs[n:] + xs[:n]
"""

ROPE_TEST = """\
import pytest

from ngt.model.rope import rotate


@pytest.mark.invariant("rope.keeps_length")
def test_keeps_length():
    assert len(rotate([1.0, 2.0, 3.0])) == 3


@pytest.mark.invariant("rope.turns_compose")
def test_turns_compose():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert rotate(rotate(xs)) == rotate(xs, turns=2) == [3.0, 4.0, 1.0, 2.0]
    assert rotate([1.0, 2.0, 3.0]) == [2.0, 3.0, 1.0]


@pytest.mark.invariant("rope.rejects_empty")
def test_rejects_empty():
    with pytest.raises(ValueError, match="non-empty"):
        rotate([])
"""

ROPE_MUTANTS = """
[[mutants]]
id = "turns-backwards"
text = "rotate turns the wrong way."
file = "packages/rope/src/ngt/model/rope.py"
find = "return xs[n:] + xs[:n]"
replace = "return xs[-n:] + xs[:-n]"
"""

MIXER_MOD = """\
from __future__ import annotations

import ngt.model.rope as rope

__all__ = ["mix"]


def mix(xs: list[float], *, scale: float = 0.5) -> list[float]:
    if any(not isinstance(x, float) for x in xs):
        raise TypeError(f"mix: expected floats, got {[type(x).__name__ for x in xs]}")
    turned = rope.rotate(xs)
    return [scale * (a + b) for a, b in zip(xs, turned, strict=True)]
"""

MIXER_TEST = """\
import pytest

from ngt.config import ModelConfig
from ngt.model.mixer import mix


@pytest.mark.invariant("mixer.averages")
def test_mix_averages_neighbours():
    assert mix([1.0, 3.0, 5.0]) == pytest.approx([2.0, 4.0, 3.0], abs=1e-9)


@pytest.mark.invariant("mixer.averages")
def test_mix_scale():
    assert mix([2.0, 6.0], scale=0.25) == pytest.approx([2.0, 2.0], abs=1e-9)


@pytest.mark.invariant("mixer.rejects_ints")
def test_rejects_ints():
    with pytest.raises(TypeError, match="expected floats"):
        mix([1, 2])


@pytest.mark.invariant("mixer.long_context")
def test_long_context():
    cfg = ModelConfig()
    if cfg.T < 4:
        pytest.skip("this check needs a context of at least 4")
    assert len(mix([1.0] * cfg.T)) == cfg.T


@pytest.mark.skipif(True, reason="needs an accelerator this machine lacks")
@pytest.mark.invariant("mixer.averages")
def test_mix_on_an_accelerator():
    raise AssertionError("never runs here")
"""

GPT_MOD = """\
from __future__ import annotations

import ngt.model.mixer as mixer
from ngt.config import ModelConfig

__all__ = ["forward"]


def forward(cfg: ModelConfig, xs: list[float]) -> list[float]:
    return mixer.mix(xs[: cfg.T])
"""

GPT_TEST = """\
import pytest

from ngt.config import ModelConfig
from ngt.model.gpt import forward


@pytest.mark.invariant("backbone_v1.truncates")
def test_truncates():
    assert len(forward(ModelConfig(V=3, T=2), [1.0, 2.0, 3.0])) == 2
"""

ATTN_MOD = """\
from __future__ import annotations

import math

import torch

__all__ = ["attend"]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if q.dtype != torch.float32:
        raise TypeError(f"attend: expected float32, got {q.dtype}")
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
"""

ATTN_TEST = """\
import pytest
import torch
import torch.nn.functional as F

from ngt.model.attention import attend


def _qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 5, 4, generator=gen) for _ in range(3)]


@pytest.mark.invariant("attention.matches_reference")
def test_matches_reference():
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attend(q, k, v), want, rtol=1e-5, atol=1e-6)


@pytest.mark.invariant("attention.rejects_half")
def test_rejects_half():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="float32"):
        attend(q.half(), k.half(), v.half())
"""

ATTN_DRIVER = """\
from __future__ import annotations

import torch

from ngt.model.attention import attend


def drive(device, record):
    q = torch.randn(2, 3, 5, 4, device=device, requires_grad=True)
    with record():
        attend(q, q, q).sum().backward()
        with torch.no_grad():
            attend(q, q, q)
"""

FAST_MOD = """\
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend_fast"]


def attend_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""

FAST_TEST = """\
import pytest
import torch

from ngt.model.attention import attend
from ngt.model.fastpath import attend_fast


@pytest.mark.invariant("fastpath.same_as_explicit")
def test_same_as_explicit():
    q = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(attend_fast(q, q, q), attend(q, q, q), rtol=1e-5, atol=1e-6)
"""

ROOT_CONFTEST = '''\
"""The maintainers' conftest: loaded by every run, never by a PR's hand."""
'''

ROOT_PYPROJECT = """\
[tool.pytest.ini_options]
addopts = ["--strict-markers", "--import-mode=importlib"]
filterwarnings = ["error"]
"""

LINE_SCOPE = """
[[paths.line_scoped]]
id = "model-config-v"
paths = ["**/tests/**/*.py"]
kind = "add_keyword"
callable = "ModelConfig"
keyword = "V"
description = "other tests may change only to add V= to ModelConfig(...) calls"
"""


def _pyproject(name: str) -> str:
    return f'[project]\nname = "ngt-{name}"\nversion = "0.1.0"\ndependencies = []\n'


def _specs() -> dict[str, str]:
    no_sdpa = f"""[[rules]]
id = "no-sdpa"
kind = "forbidden_name"
message = "no fused attention"
files = ["packages/attention/src/**/*.py"]
names = ["scaled_dot_product_attention"]

[[rules]]
id = "no-sdpa-runtime"
kind = "forbidden_ops"
message = "no fused attention kernel runs"
driver = "specs/attention/attention_runtime.py:drive"
ops = {NO_SDPA_OPS}
"""
    return {
        "core": spec(
            "core",
            [],
            ["ngt/config.py"],
            ["defaults", "keeps_fields"],
            '[[api]]\nobject = "ngt.config:ModelConfig"\nkind = "class"\n'
            '[api.methods]\n__init__ = "(self, V: int = 256, T: int = 8) -> None"\n\n',
        ),
        "rope": spec(
            "rope",
            [],
            ["ngt/model/rope.py"],
            ["keeps_length", "turns_compose", "rejects_empty"],
            _api(
                "rotate",
                "(xs: list[float], turns: int = 1) -> list[float]",
                "ngt.model.rope",
                ["rotate"],
            ),
        )
        + ROPE_MUTANTS,
        "mixer": spec(
            "mixer",
            ["core", "rope"],
            ["ngt/model/mixer.py"],
            ["averages", "rejects_ints", "long_context"],
            _api(
                "mix",
                "(xs: list[float], *, scale: float = 0.5) -> list[float]",
                "ngt.model.mixer",
                ["mix"],
            ),
            forbidden='"packages/rope/**"',
        ),
        "backbone_v1": spec(
            "backbone_v1",
            ["core", "mixer"],
            ["ngt/model/gpt.py"],
            ["truncates"],
            _api(
                "forward",
                "(cfg: ModelConfig, xs: list[float]) -> list[float]",
                "ngt.model.gpt",
                ["forward"],
            ),
            extra=LINE_SCOPE,
            may='"packages/core/src/ngt/config.py"',
        ),
        "attention": spec(
            "attention",
            [],
            ["ngt/model/attention.py"],
            ["matches_reference", "rejects_half"],
            _api(
                "attend",
                "(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor",
                "ngt.model.attention",
                ["attend"],
            )
            + no_sdpa,
        ),
        "fastpath": spec(
            "fastpath",
            ["attention"],
            ["ngt/model/fastpath.py"],
            ["same_as_explicit"],
            _api(
                "attend_fast",
                "(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor",
                "ngt.model.fastpath",
                ["attend_fast"],
            ),
        ),
    }


FILES = {
    "packages/core/src/ngt/config.py": CORE_MOD,
    "packages/core/tests/test_config.py": CORE_TEST,
    "packages/rope/src/ngt/model/rope.py": ROPE_MOD,
    "packages/rope/tests/test_rope.py": ROPE_TEST,
    "packages/mixer/src/ngt/model/mixer.py": MIXER_MOD,
    "packages/mixer/tests/test_mixer.py": MIXER_TEST,
    "packages/backbone_v1/src/ngt/model/gpt.py": GPT_MOD,
    "packages/backbone_v1/tests/test_gpt.py": GPT_TEST,
    "packages/attention/src/ngt/model/attention.py": ATTN_MOD,
    "packages/attention/tests/test_attention.py": ATTN_TEST,
    "specs/attention/attention_runtime.py": ATTN_DRIVER,
    "packages/fastpath/src/ngt/model/fastpath.py": FAST_MOD,
    "packages/fastpath/tests/test_fastpath.py": FAST_TEST,
    "conftest.py": ROOT_CONFTEST,
    "pyproject.toml": ROOT_PYPROJECT,
    "README.md": "# ngt\n",
}


class PrRepo(Repo):
    """The scenario repository; ``verdict`` runs ``contracts pr`` on ``main..HEAD``."""

    def __init__(self, root: Path, cache: Path) -> None:
        super().__init__(root)
        self.cache = cache

    def pr(self, stage: str, message: str = "change") -> str:
        return self.commit(f"{message}\n\nStage: {stage}")

    def verdict(self, *extra: str) -> tuple[int, dict[str, Any], str]:
        """``contracts pr --format json`` on ``main..HEAD``; the report is schema-checked."""
        code, out, err = self.run_pr("--format", "json", *extra)
        return code, valid_report(out) if out else {}, err

    def run_pr(self, *extra: str) -> tuple[int, str, str]:
        """``contracts pr`` on ``main..HEAD`` with this repo's cache: status, stdout, stderr."""
        out, err = io.StringIO(), io.StringIO()
        args = [
            "pr", "--repo", str(self.root), "--base", "main", "--head", "HEAD",
            "--python", sys.executable, "--cache-dir", str(self.cache), "--jobs", "1", *extra,
        ]  # fmt: skip
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
        return code, out.getvalue(), err.getvalue()


def make_pr_repo(root: Path) -> None:
    """The scenario repository on ``main``, one commit."""
    repo = Repo(root)
    root.mkdir(parents=True, exist_ok=True)
    repo.git("init", "-q", "-b", "main")
    repo.git("config", "user.name", "Maintainer")
    repo.git("config", "user.email", "maintainer@example.com")
    repo.git("config", "commit.gpgsign", "false")
    (root / "specs").mkdir()
    (root / "specs" / "spec.schema.json").write_text(SCHEMA.read_text())
    for stage, text in _specs().items():
        repo.write(f"specs/{stage}.toml", text)
        repo.write(f"packages/{stage}/pyproject.toml", _pyproject(stage))
    for path, text in FILES.items():
        repo.write(path, text)
    repo.commit("the scenario monorepo")


def findings(payload: dict[str, Any]) -> set[tuple[str, str | None]]:
    """``(rule, path)`` of every violation."""
    return {(v["rule"], v["path"]) for v in payload.get("violations", [])}


def rules_of(payload: dict[str, Any]) -> set[str]:
    return {v["rule"] for v in payload.get("violations", [])}
