"""The phases of ``contracts pr`` that judge the PR's code from outside its tests.

- ``names``: the stage's library names resolved in the sandbox interpreter
  (``source.name``: a module object, a program runner or code loader reached
  through an allowed library); the ``source`` row of the static phase judged
  the rest of the name rules from the text alone.
- ``protocol``: what every ``nn.Module`` promises, each exported module
  class on the PR against the base (``verdict.protocol``).
- ``oracle:cpu``: the differential oracle (``verdict.oracle``), decided here,
  in the trusted process, from tensors the workers sent.
- ``weakened``: after the mutants, a PR that changed or deleted its stage's
  tests has its stage's mutants run against the suite it leaves
  (``verdict.weakened``).

Each is a function of the verdict's ``State`` and the ``Environment`` the
environment phase made (``verdict.state``; ``pr.after_environment`` hands it over).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from niels_gpt_contracts.checks.code import name_rules
from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.result import KEPT, Outcome
from niels_gpt_contracts.verdict import oracle, protocol, weakened

if TYPE_CHECKING:
    from niels_gpt_contracts.verdict.state import Environment, State


def names_phase(v: State, env: Environment) -> Iterator[Outcome]:
    spec, specs = v.ctx.spec, v.ctx.specs
    interpreter = (env.box.python, env.box.environ([]))
    found = name_rules.check_names(
        spec, specs, v.ctx.head_tree, namespaces(specs), interpreter, static=False, check="names"
    )
    if found:
        yield Outcome(spec.id, "names", "BROKEN", f"{len(found)} violation(s)", found)
    else:
        yield Outcome(spec.id, "names", KEPT, "every library name resolved and allowed")


def protocol_phase(v: State, env: Environment) -> Iterator[Outcome]:
    code = (env.w.head, env.w.base)
    seed = v.request.oracle_seed
    scratch = env.box.tmp / "protocol"  # the workers write there: the workspace is read-only
    yield protocol.judge_protocol(v.ctx, v.plan, env.box, code, scratch, v.say, seed)


def oracle_phase(v: State, env: Environment) -> Iterator[Outcome]:
    code = (env.w.head, env.w.base)
    out = v.request.out or v.request.repo / "reports" / "oracle"
    yield oracle.judge(v.ctx, v.plan, env.box, code, v.say, v.request.oracle_seed, out=out)


def weakened_phase(v: State, env: Environment) -> Iterator[Outcome]:
    if v.mutants_row is None:  # --skip-mutants: nothing to measure the suite by
        why = "skipped with the mutants (--skip-mutants)"
        yield Outcome(v.stage, "weakened", "NOT RUN", why)
        return
    yield weakened.judge(v.ctx, v.plan, env.box, env.w.root, v.kills, v.mutants_row, v.jobs, v.say)
