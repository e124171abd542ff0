"""``contracts pr`` rejects PRs that game their stage's tests, naming the rule.

Each scenario is a PR on a real temporary repository (``prkit``), judged end
to end: a stage PR that breaks the code and then hides the breakage from the
tests, from pytest or from the checker. The attacks come from the
gate-integrity issue, plus a few of the same kinds.

A verdict stops at its first BROKEN row; the scenarios that show two layers
each catching the same attack (a static rule and the run that would catch it
anyway) ask for ``--full``.
"""

from __future__ import annotations

import pytest
from prkit import PrRepo, findings, rules_of

from niels_gpt_contracts.sandbox import confine

MIXER = "packages/mixer/src/ngt/model/mixer.py"
MIXER_TEST = "packages/mixer/tests/test_mixer.py"
ATTN = "packages/attention/src/ngt/model/attention.py"
CORE_TEST = "packages/core/tests/test_config.py"
# A real bug: the mix no longer averages.
BUG = ("return [scale * (a + b)", "return [scale * (a + 2 * b)")


def _broken(pr_repo: PrRepo) -> None:
    pr_repo.replace(MIXER, *BUG)


def _failed_tests(out: dict[str, object]) -> set[str]:
    return {
        v["message"].split(": ", 1)[0]  # type: ignore[index]
        for v in out["violations"]  # type: ignore[attr-defined]
        if v["rule"] == "tests.failed"  # type: ignore[index]
    }


# --- tests weakened in the stage's own test files ------------------------------------


def test_loosened_tolerance_still_fails_on_the_base_test(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pr_repo.write(MIXER_TEST, pr_repo.read(MIXER_TEST).replace("abs=1e-9", "abs=1e3"))
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert "packages/mixer/tests/test_mixer.py::test_mix_averages_neighbours" in _failed_tests(out)
    assert ("tests.failed", MIXER_TEST) in findings(out)


def test_deleted_assert_still_fails_on_the_base_test(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    kept = "    mix([2.0, 6.0], scale=0.25)\n"
    pr_repo.replace(
        MIXER_TEST, "    assert " + kept.strip() + " == pytest.approx([2.0, 2.0], abs=1e-9)\n", kept
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert "packages/mixer/tests/test_mixer.py::test_mix_scale" in _failed_tests(out)


def test_deleted_bad_input_case_with_a_silent_cast_fails(pr_repo: PrRepo) -> None:
    pr_repo.replace(
        MIXER,
        "    if any(not isinstance(x, float) for x in xs):\n"
        '        raise TypeError(f"mix: expected floats, got {[type(x).__name__ for x in xs]}")\n',
        "    xs = [float(x) for x in xs]\n",
    )
    text = pr_repo.read(MIXER_TEST)
    start = text.index('@pytest.mark.invariant("mixer.rejects_ints")')
    end = text.index('@pytest.mark.invariant("mixer.long_context")')
    pr_repo.write(MIXER_TEST, text[:start] + text[end:])
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert "packages/mixer/tests/test_mixer.py::test_rejects_ints" in _failed_tests(out)


def test_skip_in_one_of_two_tests_claiming_an_invariant_fails(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pr_repo.replace(
        MIXER_TEST,
        "def test_mix_averages_neighbours():\n",
        "def test_mix_averages_neighbours():\n    pytest.skip('flaky')\n",
    )
    pr_repo.replace(
        MIXER_TEST, "def test_mix_scale():\n", "def test_mix_scale():\n    pytest.skip('flaky')\n"
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert {
        "packages/mixer/tests/test_mixer.py::test_mix_averages_neighbours",
        "packages/mixer/tests/test_mixer.py::test_mix_scale",
    } <= _failed_tests(out)


def test_deleting_the_test_file_does_not_delete_the_test(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pr_repo.delete(MIXER_TEST)
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert "packages/mixer/tests/test_mixer.py::test_mix_averages_neighbours" in _failed_tests(out)


def test_a_skip_caused_by_the_prs_code_is_broken(pr_repo: PrRepo) -> None:
    """The PR's code makes a base test skip (a shorter default context)."""
    pr_repo.replace("packages/core/src/ngt/config.py", "T: int = 8", "T: int = 2")
    pr_repo.replace(CORE_TEST, "ModelConfig().T == 8", "ModelConfig().T == 2")
    pr_repo.pr("core")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    skipped = [v for v in out["violations"] if v["rule"] == "tests.skipped"]
    assert [v["path"] for v in skipped] == [MIXER_TEST]
    assert "test_long_context" in skipped[0]["message"]
    assert "runs on the base's code" in skipped[0]["message"]
    # and the base's own core test, which the PR edited, still fails
    assert "packages/core/tests/test_config.py::test_defaults" in _failed_tests(out)


# --- code that pytest or Python loads on its own ------------------------------------


def test_a_conftest_that_turns_failures_into_passes_is_never_loaded(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pr_repo.write(
        "packages/mixer/tests/conftest.py",
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n"
        "    report.outcome = 'passed'\n",
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert ("path.autoload", "packages/mixer/tests/conftest.py") in findings(out)
    assert "packages/mixer/tests/test_mixer.py::test_mix_averages_neighbours" in _failed_tests(out)


def test_a_sitecustomize_in_the_package_is_never_loaded(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pr_repo.write(
        "packages/mixer/src/sitecustomize.py",
        "import builtins\nbuiltins.__dict__['AssertionError'] = type('X', (Exception,), {})\n",
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert {
        ("path.autoload", "packages/mixer/src/sitecustomize.py"),
        ("module.unlisted", "packages/mixer/src/sitecustomize.py"),
    } <= findings(out)
    assert "packages/mixer/tests/test_mixer.py::test_mix_averages_neighbours" in _failed_tests(out)


def test_a_pytest11_entry_point_is_named_and_never_installed(pr_repo: PrRepo) -> None:
    _broken(pr_repo)
    pyproject = "packages/mixer/pyproject.toml"
    table = '\n[project.entry-points.pytest11]\nx = "ngt.model.mixer"\n'
    pr_repo.write(pyproject, pr_repo.read(pyproject) + table)
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert ("path.autoload", pyproject) in findings(out)
    assert _failed_tests(out)


@pytest.mark.parametrize("confined", [True, False], ids=["confined", "not-confined"])
def test_code_that_rewrites_the_reference_tests_is_caught(
    pr_repo: PrRepo, confined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PR's module, when imported, rewrites the workspace's reference tests.

    Confined (read-only mounts, where the machine allows them) the write fails;
    otherwise the guard finds it afterwards.
    """
    if not confined:
        monkeypatch.setattr(confine, "confined", lambda box, paths: (box, "not confined: test"))
    _broken(pr_repo)
    pr_repo.replace(
        MIXER,
        '__all__ = ["mix"]\n',
        '__all__ = ["mix"]\n\nimport pathlib\n\n'
        "for _f in pathlib.Path(__file__).parents[6].glob('ref/packages/*/tests/*.py'):\n"
        "    _f.write_text('def test_nothing():\\n    pass\\n')\n",
    )
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict("--full")
    assert code == 1
    assert ("source.import", MIXER) in findings(out)
    if confined and "(confined (" in err:  # the machine allows mount namespaces
        assert "Read-only file system" in str(out["violations"])
        assert "sandbox.tampered" not in rules_of(out)
    else:
        assert "sandbox.tampered" in rules_of(out)


# --- code placed or reached where the name rules do not look -------------------------


def test_a_module_shadowing_another_stage_is_named(pr_repo: PrRepo) -> None:
    pr_repo.write(
        "packages/mixer/src/ngt/model/rope.py",
        "def rotate(xs, turns=1):\n    return list(xs)\n",
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert ("module.shadowed", "packages/mixer/src/ngt/model/rope.py") in findings(out)


def test_a_symlinked_module_is_named(pr_repo: PrRepo) -> None:
    pr_repo.symlink(ATTN, "../../../../fastpath/src/ngt/model/fastpath.py")
    pr_repo.pr("attention")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert ("path.symlink", ATTN) in findings(out)


def test_an_assigned_signature_is_named(pr_repo: PrRepo) -> None:
    pr_repo.replace(
        MIXER,
        "def mix(xs: list[float], *, scale: float = 0.5) -> list[float]:",
        "def mix(xs: list[float], *, scale: float = 0.5, cheat: bool = False) -> list[float]:",
    )
    pr_repo.write(
        MIXER,
        pr_repo.read(MIXER)
        + "\n\ndef _spec(xs: list[float], *, scale: float = 0.5) -> list[float]: ...\n\n\n"
        "import inspect\n\nmix.__signature__ = inspect.signature(_spec)\n",
    )
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert ("api.source", MIXER) in findings(out)


def test_v_that_runs_code_in_another_stages_test_is_named(pr_repo: PrRepo) -> None:
    pr_repo.replace(
        CORE_TEST,
        "ModelConfig(T=4)",
        'ModelConfig(V=(__import__("pathlib").Path("/tmp/x").exists() or 256), T=4)',
    )
    pr_repo.pr("backbone_v1")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert ("path.line-scope", CORE_TEST) in findings(out)


def test_an_emptied_parametrisation_is_named(pr_repo: PrRepo) -> None:
    """A base test parametrised by the PR's code loses its cases."""
    pr_repo.git("checkout", "-q", "main")
    pr_repo.replace(
        MIXER, '__all__ = ["mix"]\n', '__all__ = ["SCALES", "mix"]\n\nSCALES = (0.5, 0.25)\n'
    )
    importing = "from ngt.model.mixer import "
    pr_repo.write(
        MIXER_TEST,
        pr_repo.read(MIXER_TEST).replace(importing + "mix", importing + "SCALES, mix")
        + '\n\n@pytest.mark.invariant("mixer.averages")\n'
        '@pytest.mark.parametrize("scale", SCALES)\n'
        "def test_each_scale(scale):\n"
        "    assert mix([1.0, 1.0], scale=scale) == [2 * scale, 2 * scale]\n",
    )
    pr_repo.replace("specs/mixer.toml", 'exports = ["mix"]', 'exports = ["SCALES", "mix"]')
    pr_repo.commit("parametrised on main")
    pr_repo.git("checkout", "-q", "pr")
    pr_repo.git("merge", "-q", "main")
    pr_repo.replace(MIXER, "SCALES = (0.5, 0.25)", "SCALES = ()")
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert {"tests.missing", "tests.skipped"} <= rules_of(out)


@pytest.mark.scenario  # a verdict with torch in the sandbox each: nox -s test-scenarios
@pytest.mark.parametrize(
    ("reach", "rules"),
    [
        ('getattr(F, "scaled_" + "dot_product_attention")', {"source.dynamic"}),
        ('globals()["F"].scaled_dot_product_attention', {"source.dynamic", "static.no-sdpa"}),
        ('F.__dict__["scaled_" + "dot_product_attention"]', {"source.dynamic"}),
    ],
    ids=["getattr", "globals", "dict"],
)
def test_sdpa_reached_by_a_built_name_is_caught_at_run_time(
    pr_repo: PrRepo, reach: str, rules: set[str]
) -> None:
    pr_repo.replace(ATTN, "import torch\n", "import torch\nimport torch.nn.functional as F\n")
    first = "    t = q.shape[-2]\n"
    pr_repo.replace(ATTN, first, f"    return {reach}(q, k, v, is_causal=True)\n{first}")
    pr_repo.pr("attention")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert rules | {"runtime.no-sdpa-runtime"} <= rules_of(out), out["violations"]


@pytest.mark.scenario  # a verdict with torch in the sandbox: nox -s test-scenarios
def test_a_lazy_import_of_the_fastpath_stage_is_caught(pr_repo: PrRepo) -> None:
    pr_repo.replace(
        ATTN,
        "    t = q.shape[-2]\n",
        "    from ngt.model.fastpath import attend_fast\n\n    return attend_fast(q, k, v)\n"
        "    t = q.shape[-2]\n",
    )
    pr_repo.pr("attention")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert {"module.undeclared-import", "runtime.no-sdpa-runtime"} <= rules_of(out)


@pytest.mark.scenario  # a verdict with torch in the sandbox: nox -s test-scenarios
def test_sdpa_only_under_no_grad_is_caught(pr_repo: PrRepo) -> None:
    """Fused attention only where no gradient is asked for, reached by passing getattr."""
    pr_repo.replace(ATTN, "import math\n", "import functools\nimport math\n")
    first = "    t = q.shape[-2]\n"
    pr_repo.replace(
        ATTN,
        first,
        "    if not torch.is_grad_enabled():\n"
        '        kernel = functools.reduce(getattr, ("nn", "functional", "scaled_dot_product_"'
        ' + "attention"), torch)\n'
        "        return kernel(q, k, v, is_causal=True)\n" + first,
    )
    pr_repo.pr("attention")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert {"source.dynamic", "runtime.no-sdpa-runtime"} <= rules_of(out), out["violations"]


def test_a_stage_weakening_its_own_tests_under_a_line_permission_pattern(pr_repo: PrRepo) -> None:
    """backbone_v1's own tests match its V= permission's patterns, yet run as the base has them."""
    pr_repo.replace("packages/backbone_v1/src/ngt/model/gpt.py", "xs[: cfg.T]", "xs")
    pr_repo.replace("packages/backbone_v1/tests/test_gpt.py", "== 2", ">= 2")
    pr_repo.pr("backbone_v1")
    code, out, _ = pr_repo.verdict()
    assert code == 1
    assert "packages/backbone_v1/tests/test_gpt.py::test_truncates" in _failed_tests(out)
