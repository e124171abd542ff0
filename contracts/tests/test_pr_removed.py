"""``tests.removed``: a stage PR that switches off one of its stage's tests is BROKEN.

Each scenario is a ``contracts pr`` verdict on the scenario repository
(``prkit``) whose PR leaves the stage's code right, so the reference run (the
base's tests) passes: only the PR's own version of the tests lost a test.
The controls add a test, or edit one that still runs, and stay KEPT.
"""

from __future__ import annotations

from typing import Any

import pytest
from prkit import PrRepo, rules_of

MIXER_TEST = "packages/mixer/tests/test_mixer.py"
SCALE = f"{MIXER_TEST}::test_mix_scale"
HEAD = "def test_mix_scale():\n"


def _removed(out: dict[str, Any]) -> list[str]:
    return [v["message"] for v in out["violations"] if v["rule"] == "tests.removed"]


def _cut(text: str, start: str, end: str) -> str:
    return text[: text.index(start)] + text[text.index(end) :]


@pytest.mark.parametrize(
    ("edit", "how"),
    [
        (
            lambda t: _cut(
                t,
                '@pytest.mark.invariant("mixer.averages")\ndef test_mix_scale',
                '@pytest.mark.invariant("mixer.rejects_ints")',
            ),
            "no longer runs it",
        ),
        (lambda t: t.replace(HEAD, HEAD + "    pytest.skip('slow')\n"), "skips it (Skipped: slow)"),
        (
            lambda t: t.replace(HEAD, "@pytest.mark.xfail(reason='flaky')\n" + HEAD),
            "expected failure",
        ),
        (
            lambda t: t.replace(HEAD, "@pytest.mark.skipif(True, reason='later')\n" + HEAD),
            "skips it (Skipped: later)",
        ),
    ],
    ids=["deleted", "skip-inside", "xfail", "skipif"],
)
def test_a_test_the_pr_switches_off_is_named(pr_repo: PrRepo, edit: Any, how: str) -> None:
    before = pr_repo.read(MIXER_TEST)
    after = edit(before)
    assert after != before
    pr_repo.write(MIXER_TEST, after)
    pr_repo.pr("mixer", "tidy the tests")
    code, out, _ = pr_repo.verdict("--skip-mutants")
    assert code == 1, out["violations"]
    named = _removed(out)
    assert len(named) == 1, out["violations"]
    assert named[0].startswith(f"{SCALE}: the base collects and runs"), named
    assert how in named[0], named
    assert rules_of(out) == {"tests.removed"}  # the code is right: nothing else is wrong


def test_a_deleted_test_file_names_every_test_it_held(pr_repo: PrRepo) -> None:
    pr_repo.delete(MIXER_TEST)
    pr_repo.pr("mixer", "drop the tests")
    code, out, _ = pr_repo.verdict("--skip-mutants")
    assert code == 1
    named = {m.split(": ", 1)[0] for m in _removed(out)}
    # the accelerator test skips on the base as well: it is not demanded
    assert named == {
        f"{MIXER_TEST}::{t}"
        for t in ("test_mix_averages_neighbours", "test_mix_scale", "test_rejects_ints",
                  "test_long_context")
    }, out["violations"]  # fmt: skip


def test_a_renamed_test_is_named_under_its_base_name(pr_repo: PrRepo) -> None:
    """A conftest.py that deselects is refused by ``path.autoload``; a rename is not."""
    pr_repo.replace(MIXER_TEST, HEAD, "def _mix_scale():\n")
    pr_repo.pr("mixer", "a helper")
    code, out, _ = pr_repo.verdict("--skip-mutants")
    assert code == 1, out["violations"]
    assert [m.split(": ", 1)[0] for m in _removed(out)] == [SCALE], out["violations"]
    assert "no longer runs it (deleted, renamed or deselected)" in _removed(out)[0]


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: (
            t
            + "\n\ndef test_mix_of_one():\n"
            + "    assert mix([4.0], scale=0.5) == pytest.approx([4.0])\n"
        ),
        lambda t: t.replace("mix([2.0, 6.0], scale=0.25)", "mix([2.0, 6.0], scale=1 / 4)"),
    ],
    ids=["a-new-test", "an-edited-test-still-run"],
)
def test_a_pr_that_keeps_every_test_stays_kept(pr_repo: PrRepo, edit: Any) -> None:
    pr_repo.write(MIXER_TEST, edit(pr_repo.read(MIXER_TEST)))
    pr_repo.pr("mixer", "one more test")
    code, out, _ = pr_repo.verdict("--skip-mutants")
    assert code == 0, out["violations"]
    assert _removed(out) == []
