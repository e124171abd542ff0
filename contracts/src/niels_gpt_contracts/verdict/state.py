"""What ``contracts pr`` was asked (``PrRequest``), what its phases share (``State``)
and what the environment phase makes for the phases after it (``Environment``).

Its own module so that the phases in ``outside_tests`` and ``mutation`` can name
these types without importing ``pr``, which imports them: the verdict's
modules import each other in one direction only (import-linter's
``acyclic_siblings`` contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.checks.evidence import invariants
from niels_gpt_contracts.mutants.store import Cache
from niels_gpt_contracts.result import Outcome, Result
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.verdict import integrity, plan
from niels_gpt_contracts.verdict.files import Workspace

Say = Callable[[str], None]


@dataclass
class PrRequest:
    """What ``contracts pr`` was asked."""

    repo: Path
    base: str
    head: str | None
    stage: str | None = None
    python: str | None = None
    cache: Path = Path(".contracts-cache")
    devices: tuple[str, ...] = ("cpu",)
    require_devices: tuple[str, ...] = ()
    jobs: int = 0
    mutants: bool = True
    timeout: float = 1800.0
    full: bool = False
    oracle_seed: int | None = None  # None: a fresh secret seed (verdict.oracle)
    out: Path | None = None  # the oracle's reproducer folder; None: <repo>/reports/oracle


@dataclass(frozen=True)
class Environment:
    """What the environment phase makes, taken by every phase after it that runs the
    PR's code: the sandbox interpreter, the workspace, the (confined) sandbox and
    the integrity guard's first snapshot."""

    python: str
    w: Workspace
    box: Sandbox
    guard: integrity.Guard


@dataclass
class State:
    """What the phases share; filled as they run (``env`` by the environment phase)."""

    request: PrRequest
    ctx: pr_context.PrContext
    result: Result
    say: Say
    kills: Cache
    scratch: Path
    jobs: int
    python_given: str | None
    plan: plan.Plan = field(init=False)
    claims: list[invariants.Claim] = field(default_factory=list)
    env: Environment | None = None
    usable: dict[str, bool] = field(default_factory=dict)
    mutants_row: Outcome | None = None  # the base suite's kills, for ``weakened``

    @property
    def stage(self) -> str:
        return self.ctx.spec.id
