"""``.github/workflows/contracts.yml``, replayed step by step on a scratch repository.

The scratch "GitHub" repository holds this working tree as ``main`` and three
PRs of the ``padding`` stage (a leaf: no stage depends on it or imports it, so its verdict
is quick). ``actkit`` runs every job the way the workflow says, on a
``push`` to main and on each PR; what it cannot emulate fails the test.

- push: ``warm-cache`` installs the checker into a fresh venv with the
  workflow's exact line (the checker's install test: nothing but its declared
  dependencies), builds the sandbox environment and saves it;
- from that venv, ``contracts check`` judges the tree and the PRs (with the
  sandbox interpreter for the API);
- an honest PR (a docstring): ``contracts`` restores the environment and
  passes, the verdict table in its log; the device jobs, with no runner,
  print a NOT RUN notice and pass;
- a PR that also edits ``README.md`` (outside the stage's paths):
  ``contracts`` fails with the rule's ``::error`` annotation;
- a PR with no ``Stage:`` trailer: ``contracts`` fails, no verdict given.

``nox -s test-workflow`` runs it (``CI`` runs it through ``.ci/run``).
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from actexpr import Evaluator, Unsupported
from actkit import PIP_NOTE, REPOSITORY, Event, JobRun, Replay

pytestmark = pytest.mark.workflow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "contracts.yml"
STAGE_MODULE = "packages/padding/src/niels_gpt/model/padding/padded.py"
PR_JOBS = ("contracts", "test-mps", "test-cuda")


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@dataclass
class GitHub:
    """The scratch repository the replay checks out from, and the replay."""

    remote: Path
    replay: Replay
    base: str
    prs: int = 0

    def push(self) -> dict[str, JobRun]:
        payload = {
            "ref": "refs/heads/main",
            "after": self.base,
            "repository": {"full_name": REPOSITORY},
        }
        return self.replay.run(Event("push", self.base, "refs/heads/main", payload))

    def pull_request(self, edits: dict[str, str], message: str) -> tuple[str, Event]:
        """A PR branch from main with ``edits`` (path -> text), and its event."""
        self.prs += 1
        n, branch = self.prs, f"pr-{self.prs}"
        git(self.remote, "checkout", "-q", "-b", branch, "main")
        for path, text in edits.items():
            (self.remote / path).write_text(text)
        git(self.remote, "commit", "-qam", message)
        head = git(self.remote, "rev-parse", "HEAD")
        git(self.remote, "checkout", "-q", "main")
        tree = git(self.remote, "merge-tree", "--write-tree", "main", branch)
        merge = git(self.remote, "commit-tree", tree, "-p", self.base, "-p", head, "-m", "merge")
        git(self.remote, "update-ref", f"refs/pull/{n}/head", head)
        git(self.remote, "update-ref", f"refs/pull/{n}/merge", merge)
        repo = {"full_name": REPOSITORY}
        payload = {
            "number": n,
            "pull_request": {
                "number": n,
                "head": {"sha": head, "ref": branch, "repo": repo},
                "base": {"sha": self.base, "ref": "main", "repo": repo},
            },
        }
        return head, Event("pull_request", merge, f"refs/pull/{n}/merge", payload)


def _docstring(remote: Path, words: str) -> str:
    text = (remote / STAGE_MODULE).read_text()
    assert text.startswith('"""Left-padded batches:'), (
        f"{STAGE_MODULE} no longer starts as the PRs expect"
    )
    return text.replace('"""Left-padded batches:', f'"""{words} Left-padded batches:', 1)


@pytest.fixture(scope="module")
def github(tmp_path_factory: pytest.TempPathFactory) -> GitHub:
    """This working tree (tracked and new files, as they are now) as ``main``."""
    scratch = tmp_path_factory.mktemp("replay")
    remote = scratch / "github"
    remote.mkdir()
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file() or source.is_symlink():
            continue
        (remote / name).parent.mkdir(parents=True, exist_ok=True)
        (remote / name).write_bytes(source.read_bytes())
        os.chmod(remote / name, source.stat().st_mode)
    git(remote, "init", "-q", "-b", "main")
    for key, value in (("user.name", "Maintainer"), ("user.email", "m@example.com")):
        git(remote, "config", key, value)
    git(remote, "config", "commit.gpgsign", "false")
    git(remote, "config", "uploadpack.allowAnySHA1InWant", "true")
    git(remote, "add", "-A")
    git(remote, "commit", "-qm", "main as the replay found it")
    base = git(remote, "rev-parse", "HEAD")
    return GitHub(remote, Replay(WORKFLOW, remote, scratch, {}), base)


@pytest.fixture(scope="module")
def pushed(github: GitHub) -> dict[str, JobRun]:
    """The push to main that warms the cache; every PR below restores it."""
    return github.push()


def _show(job: JobRun) -> str:
    return f"{job.id} ({job.status}):\n" + "\n".join(job.log[-80:])


def _steps(job: JobRun) -> str:
    """The job's step lines (name, then how long it took), for -s runs and failures."""
    return "\n".join(line for line in job.log if line.startswith(("--- ", "time: ")))


def test_the_push_to_main_installs_the_checker_and_saves_the_environment(
    github: GitHub, pushed: dict[str, JobRun]
) -> None:
    warm = pushed["warm-cache"]
    print(_steps(warm))
    assert warm.status == "success", _show(warm)
    assert all(pushed[j].status == "skipped" for j in PR_JOBS)
    assert "actions/cache/save" in warm.actions
    saved = sorted(p.name for p in github.replay.store.iterdir())
    assert len(saved) == 1 and re.fullmatch(r"contracts-Linux-[0-9a-f]{64}", saved[0]), saved
    note = PIP_NOTE.format(
        name="Build the sandbox environment from main's constraints",
        vars="PIP_INDEX_URL and PIP_EXTRA_INDEX_URL",
    )
    assert note in warm.log
    # A second push with the same constraints finds it built and builds nothing.
    again = github.push()["warm-cache"]
    assert again.status == "success", _show(again)
    assert "actions/cache/save" not in again.actions
    assert any("Build the sandbox environment" in line and "skipped" in line for line in again.log)


def test_the_checker_installed_alone_judges_the_tree_and_a_pr(
    github: GitHub, pushed: dict[str, JobRun]
) -> None:
    """The install test: the venv the push job made with the workflow's line."""
    temp = pushed["warm-cache"].temp
    assert temp is not None
    contracts = temp / "gate" / "bin" / "contracts"
    sandbox = next((temp / "contracts-cache" / "envs").glob("*/bin/python"))
    tree = subprocess.run([str(contracts), "check", "--no-api", "--repo", str(github.remote)])
    assert tree.returncode == 0
    head, _ = github.pull_request(
        {STAGE_MODULE: _docstring(github.remote, "Quick.")}, "docs\n\nStage: padding"
    )
    bad, _ = github.pull_request(
        {STAGE_MODULE: _docstring(github.remote, "Quick."), "README.md": "# notes\n"},
        "docs and notes\n\nStage: padding",
    )
    for rev, want in ((head, 0), (bad, 1)):
        judged = subprocess.run(
            [str(contracts), "check", "--repo", str(github.remote), "--python", str(sandbox),
             "--base", "main", "--head", rev],
            capture_output=True, text=True,
        )  # fmt: skip
        assert judged.returncode == want, judged.stdout[-3000:] + judged.stderr[-2000:]


@pytest.fixture(scope="module")
def prs(github: GitHub, pushed: dict[str, JobRun]) -> dict[str, dict[str, JobRun]]:
    """Three PRs, replayed at once as GitHub would run them (each job in its own folders)."""
    cases = {
        "honest": (
            {STAGE_MODULE: _docstring(github.remote, "Honest.")},
            "a word\n\nStage: padding",
        ),
        "broken": (
            {STAGE_MODULE: _docstring(github.remote, "Also."), "README.md": "# notes\n"},
            "a word and the README\n\nStage: padding",
        ),
        "no trailer": ({STAGE_MODULE: _docstring(github.remote, "Quiet.")}, "a word"),
    }
    events = {name: github.pull_request(*case)[1] for name, case in cases.items()}
    with ThreadPoolExecutor(max_workers=len(events)) as pool:
        runs = dict(zip(events, pool.map(github.replay.run, events.values()), strict=True))
    for name, jobs in runs.items():  # kept beside the scratch repository, to read after a run
        for job in jobs.values():
            log = github.replay.scratch / f"log-{name.replace(' ', '-')}-{job.id}.txt"
            log.write_text(f"{job.name} ({job.status})\n{job.text()}\n")
    return runs


def test_an_honest_pr_passes_with_the_verdict_table_in_its_log(
    prs: dict[str, dict[str, JobRun]],
) -> None:
    jobs = prs["honest"]
    job = jobs["contracts"]
    print(_steps(job))
    assert job.status == "success", _show(job)
    log = job.text()
    assert re.search(r"cache contracts-Linux-\w+: hit", log)
    for check in ("paths", "api", "tests:cpu", "device:cpu", "mutants", "sandbox"):
        assert re.search(rf"^KEPT +padding +{re.escape(check)} ", log, re.MULTILINE), check
    assert re.search(r"^time: static [0-9.]+ s, ", log, re.MULTILINE)
    assert "::notice title=contracts::KEPT: 1 stage" in log
    assert jobs["warm-cache"].status == "skipped"
    assert not any("actions/cache/save" in j.actions for j in jobs.values())
    for device, name in (("mps", "test-mps"), ("cuda", "test-cuda")):
        run = jobs[name]
        assert run.status == "success", _show(run)
        assert f"NOT RUN device:{device}" in run.text() and "NOT RUN" in run.name
        assert run.actions == []  # nothing checked out, installed or run


def test_a_pr_that_breaks_a_rule_fails_with_the_rules_annotation(
    prs: dict[str, dict[str, JobRun]],
) -> None:
    job = prs["broken"]["contracts"]
    assert job.status == "failure", _show(job)
    assert any(
        line.startswith("::error file=README.md,title=path.not-allowed (padding)::")
        for line in job.log
    ), _show(job)
    assert re.search(r"^BROKEN +padding +paths ", job.text(), re.MULTILINE)
    assert all(prs["broken"][j].status == "success" for j in ("test-mps", "test-cuda"))


def test_a_pr_without_a_stage_trailer_gets_no_verdict(prs: dict[str, dict[str, JobRun]]) -> None:
    job = prs["no trailer"]["contracts"]
    assert job.status == "failure", _show(job)
    assert any(
        line.startswith("::error title=contracts configuration error::expected a 'Stage: <id>'")
        for line in job.log
    ), _show(job)


def test_what_the_replay_cannot_emulate_fails_it(github: GitHub, tmp_path: Path) -> None:
    """A device job with its runner set runs on that runner: not emulated, so it fails."""
    replay = Replay(WORKFLOW, github.remote, tmp_path, {"CUDA_RUNNER": "gpu-box"})
    _, event = github.pull_request(
        {STAGE_MODULE: _docstring(github.remote, "Odd.")}, "x\n\nStage: padding"
    )
    replay.workflow["jobs"] = {"test-cuda": replay.workflow["jobs"]["test-cuda"]}
    with pytest.raises(Unsupported, match="gpu-box"):
        replay.run(event)


def test_every_action_is_pinned_and_no_pr_job_saves_a_cache() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["permissions"] == {"contents": "read"}
    for job_id, job in workflow["jobs"].items():
        for step in job["steps"]:
            uses = step.get("uses", "")
            assert not uses or re.fullmatch(r"[\w./-]+@[0-9a-f]{40}", uses), (job_id, uses)
            if job.get("if") == "github.event_name == 'pull_request'":
                assert "cache/save" not in uses, job_id
                assert step.get("with", {}).get("persist-credentials", False) in (False, "false")
    # The verdict is the contracts job's last step: nothing runs after it.
    assert workflow["jobs"]["contracts"]["steps"][-1]["name"].startswith("Verdict")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("vars.MISSING != ''", False),  # null and '' are both 0
        ("vars.MISSING == null", True),
        ("'ABC' == 'abc'", True),  # strings compare ignoring case
        ("vars.X && 'yes' || 'no'", "yes"),
        ("vars.MISSING && 'yes' || 'no'", "no"),
        ("!(github.event_name == 'push')", False),
        ("!github.event.missing", True),
        ("github.event.pull_request.head.sha", None),
        ("'it''s'", "it's"),
    ],
)
def test_expressions_follow_github(tmp_path: Path, expression: str, value: object) -> None:
    contexts = {"vars": {"X": "1"}, "github": {"event_name": "push", "event": {}}}
    assert Evaluator(contexts, tmp_path).evaluate(expression) == value


@pytest.mark.parametrize("expression", ["1 < 2", "fromJSON('1')", "secrets.TOKEN", "a[0]"])
def test_expressions_beyond_the_subset_fail(tmp_path: Path, expression: str) -> None:
    with pytest.raises(Unsupported):
        Evaluator({"vars": {}}, tmp_path).evaluate(expression)
