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
from prsources import (
    ATTN_DRIVER,
    ATTN_MOD,
    ATTN_TEST,
    CORE_MOD,
    CORE_TEST,
    FAST_MOD,
    FAST_TEST,
    GPT_MOD,
    GPT_TEST,
    MIXER_MOD,
    MIXER_TEST,
    ROPE_MOD,
    ROPE_MUTANTS,
    ROPE_TEST,
)

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
