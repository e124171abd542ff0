"""A planned rewrite and the mutants it makes stale, through ``contracts pr``.

A PR that rewrites the line a mutant patches makes that mutant stale, which is
BROKEN: a PR cannot escape a mutant by moving its code. Only the base can say
a rewrite is planned: a maintainers' amendment marks the mutant
``retarget = true``; the stage PR built on it reports the mutant NOT RUN
(never KEPT), and a PR cannot set the mark for itself.
"""

from __future__ import annotations

from prkit import PrRepo

ROPE = "packages/rope/src/ngt/model/rope.py"
SPEC = "specs/rope.toml"
OLD = "return xs[n:] + xs[:n]"
NEW = "head, tail = xs[n:], xs[:n]\n    return head + tail"


def _mutants_row(out: dict[str, object]) -> dict[str, str]:
    return next(o for o in out["outcomes"] if o["check"] == "mutants")  # type: ignore[attr-defined,no-any-return]


def _mark(repo: PrRepo, trailers: str) -> None:
    repo.replace(SPEC, 'id = "turns-backwards"', 'id = "turns-backwards"\nretarget = true')
    repo.replace(SPEC, 'version = "1.0.0"', 'version = "1.0.1"')
    repo.commit(f"amend rope: a rewrite is planned\n\n{trailers}")


def test_a_rewrite_that_makes_a_mutant_stale_is_broken(pr_repo: PrRepo) -> None:
    pr_repo.replace(ROPE, OLD, NEW)
    pr_repo.pr("rope", "rope: the same rotation, written out")
    code, out, err = pr_repo.verdict()
    assert code == 1, err[-2000:]
    row = _mutants_row(out)
    assert row["status"] == "BROKEN" and "1 stale" in row["summary"]


def test_a_mark_set_by_the_pr_itself_changes_nothing(pr_repo: PrRepo) -> None:
    pr_repo.replace(ROPE, OLD, NEW)
    _mark(pr_repo, "Stage: rope")  # the stage PR brings the mark itself
    code, out, err = pr_repo.verdict("--full")  # past the path rule's BROKEN row
    assert code == 1, err[-2000:]
    assert _mutants_row(out)["status"] == "BROKEN"  # the base's catalogue: stale, unmarked
    assert ("path.meta", SPEC) in {(v["rule"], v["path"]) for v in out["violations"]}


def test_a_mark_on_the_base_makes_the_mutant_not_run_in_that_pr(pr_repo: PrRepo) -> None:
    pr_repo.git("checkout", "-q", "main")
    _mark(pr_repo, "Spec: rope")
    pr_repo.git("checkout", "-q", "-B", "pr")
    pr_repo.replace(ROPE, OLD, NEW)
    pr_repo.pr("rope", "rope: the same rotation, written out")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])
    row = _mutants_row(out)
    assert row["status"] == "NOT RUN"
    assert row["summary"].endswith(
        "1 NOT RUN, marked for re-targeting by the base's amendment (retarget = true): "
        "rope.turns-backwards"
    )
