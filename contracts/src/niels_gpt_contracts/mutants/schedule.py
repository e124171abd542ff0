"""Running a plan's mutants: proven kills first, then hinted runs, then the rest.

1. A mutant whose proof key (``proof``) matches a kill in the store is
   killed without a run; a stale mutant or one that does not compile is
   decided without a run too.
2. Hinted mutants (``hints``): for each stage, the hinted ids that its run
   really collects (a stale or mistyped hint is dropped), then one clean run
   of them, which must all pass (else that stage's hints are dropped);
   then each hinted mutant runs its hinted test alone. A failure there is a
   kill proven afresh: the same test, run the same way, passed on the clean
   code and fails on the mutant. A mutant its hint does not kill goes on.
3. The rest: for each stage, the clean run of all its claiming tests (it
   must pass, and times them), then each remaining mutant with those tests,
   fastest first, stopping at the first failure.

Runs go ``jobs`` at a time (one fork server each). With ``stop_early`` no
new run starts once a mutant is not killed (a stale one counts); the mutants
that never ran are returned apart, never as killed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants.catalogue import Mutant
from niels_gpt_contracts.mutants.fates import (
    Fate,
    Plan,
    StageRun,
    fastest_first,
    first_failure,
    judge,
)
from niels_gpt_contracts.mutants.launcher import Launcher

Say = Callable[[str], None]


@dataclass
class Todo:
    mutant: Mutant
    source: str  # the mutated module's text
    hint: str | None = None


@dataclass
class Outcome:
    fates: dict[str, Fate] = field(default_factory=dict)
    clean: list[StageRun] = field(default_factory=list)
    not_run: list[Mutant] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        launcher: Launcher,
        plans: Sequence[Plan],
        jobs: int,
        timeout: float,
        say: Say,
        stop_early: bool,
    ) -> None:
        self.launcher = launcher
        self.plan_of = {p.stage: p for p in plans}
        self.jobs = jobs
        self.timeout = timeout
        self.say = say
        self.stop_early = stop_early
        self.stop = threading.Event()
        self.count = itertools.count(1)
        self.total = 0

    def _clean(self, stage: str, tests: list[str], label: str) -> StageRun:
        p = self.plan_of[stage]
        r = self.launcher.run(p.stage, tests, p.hypothesis, None)
        ok = r.code == 0
        why = "passed" if ok else ("timeout" if r.code is None else first_failure(r.output))
        if ok and label == "clean":
            p.order = fastest_first(r.output)
        run = StageRun(stage, ok, why, r.seconds, tests)
        state = "passed" if ok else "FAILED"
        self.say(f"{label.upper()} {stage} {state} ({r.seconds:.1f} s, {len(tests)} tests)")
        return run

    def _mutant(self, item: Todo, tests: list[str], how: str) -> Fate | None:
        if self.stop.is_set():
            return None
        m = item.mutant
        p = self.plan_of[m.stage]
        run = self.launcher.run(p.stage, tests, p.hypothesis, (m, item.source))
        fate = judge(m, run, self.timeout)
        if fate.status != "killed" and how == "hint":
            return None  # not proof of anything: the full run decides
        self.say(
            f"  [{next(self.count)}/{self.total}] {m.name}: {fate.status} "
            f"in {fate.seconds:.1f} s ({how})"
        )
        if fate.status != "killed" and self.stop_early:
            self.stop.set()
        return fate

    def run(self, todo: list[Todo], out: Outcome) -> None:
        self.total = len(todo)
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            rest = self._hinted(pool, todo, out)
            self._full(pool, rest, out)

    def _collected(self, stage: str, hints: list[str]) -> set[str]:
        """The hinted ids this stage's run really has (a stale or mistyped id is no test)."""
        p = self.plan_of[stage]
        files = sorted({h.split("::", 1)[0] for h in hints})
        r = self.launcher.run(p.stage, files, p.hypothesis, None, collect=True)
        listed = {line.strip() for line in r.output.splitlines()} if r.code == 0 else set()
        return {h for h in hints if h in listed}

    def _hinted(self, pool: ThreadPoolExecutor, todo: list[Todo], out: Outcome) -> list[Todo]:
        hinted = [t for t in todo if t.hint]
        stages = list(dict.fromkeys(t.mutant.stage for t in hinted))
        asked = {
            s: sorted({t.hint for t in hinted if t.mutant.stage == s and t.hint}) for s in stages
        }
        found = dict(
            zip(stages, pool.map(lambda s: self._collected(s, asked[s]), stages), strict=True)
        )
        for t in hinted:
            if t.hint not in found[t.mutant.stage]:
                t.hint = None
        stages = [s for s in stages if found[s]]
        wanted = {s: sorted(found[s]) for s in stages}
        cleans = list(pool.map(lambda s: self._clean(s, wanted[s], "hints"), stages))
        out.clean += cleans
        usable = {c.stage for c in cleans if c.ok}
        for c in cleans:
            if not c.ok:
                self.say(f"hints of {c.stage} not used (their clean run: {c.reason})")
        tried = [t for t in hinted if t.hint and t.mutant.stage in usable]
        results = pool.map(lambda t: self._mutant(t, [t.hint or ""], "hint"), tried)
        for item, fate in zip(tried, results, strict=True):
            if fate is not None:
                out.fates[item.mutant.name] = fate
        return [t for t in todo if t.mutant.name not in out.fates]

    def _full(self, pool: ThreadPoolExecutor, rest: list[Todo], out: Outcome) -> None:
        if self.stop.is_set():
            out.not_run += [t.mutant for t in rest]
            return
        stages = list(dict.fromkeys(t.mutant.stage for t in rest))
        cleans = list(pool.map(lambda s: self._clean(s, self.plan_of[s].tests, "clean"), stages))
        out.clean += cleans
        failed = [c for c in cleans if not c.ok]
        if failed:
            raise ConfigError(
                "the clean test run must pass before mutants mean anything: "
                + "; ".join(f"{c.stage}: {c.reason}" for c in failed)
            )

        def full(item: Todo) -> Fate | None:
            p = self.plan_of[item.mutant.stage]
            return self._mutant(item, p.order or p.tests, "all tests")

        for item, fate in zip(rest, pool.map(full, rest), strict=True):
            if fate is None:
                out.not_run.append(item.mutant)
            else:
                out.fates[item.mutant.name] = fate
