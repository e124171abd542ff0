"""Replay a GitHub Actions workflow here, step by step as written (nektos/act's idea, no Docker).

Each job whose ``if:`` holds runs its steps in order, in a fresh runner
folder: ``GITHUB_WORKSPACE``, ``RUNNER_TEMP``, the event's payload file, the
default variables (``CI=true``, ``GITHUB_SHA``, ``GITHUB_REF``...), the
workflow's, job's and step's ``env:`` and the expressions (``actexpr``). A
``run:`` step is a script run with ``bash -e`` (``shell: bash`` adds
``-o pipefail``) in its working directory. Actions are emulated:

- ``actions/checkout``: a fresh repository fetching the named ref (the whole
  history with ``fetch-depth: 0``) from the scratch "GitHub" repository;
- ``actions/setup-python``: the Python running this replay (the same
  ``major.minor`` or the step fails), first on ``PATH`` as ``python``;
- ``actions/cache/save`` and ``actions/cache/restore``: the path into and out
  of a store, by key (an existing key is not overwritten; a restore is a
  private copy, so nothing a job does to it reaches the store).

Everything else (another action or shell, ``needs:``, a matrix, a container,
a runner other than ``ubuntu-latest``, persisted credentials, an unpinned
action, a step writing ``GITHUB_ENV``...) raises ``Unsupported``: the replay
fails rather than pretend.

One difference from GitHub, said in every log that it applies to: the
workflow's ``PIP_INDEX_URL`` and ``PIP_EXTRA_INDEX_URL`` (PyTorch's CPU index,
PyPI) cannot be reached from this machine, so a step that sets them runs
with this machine's own pip index instead; nothing else is changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from actexpr import Evaluator, Unsupported, text

PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
PIP_INDEX = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
PIP_NOTE = (
    "replay: {name}: the workflow's {vars} are not reachable from this machine; "
    "pip uses this machine's own index instead (the only change the replay makes)"
)
STEP_KEYS = {"name", "id", "if", "uses", "with", "run", "env", "shell", "working-directory"}
JOB_KEYS = {"name", "if", "runs-on", "timeout-minutes", "env", "steps", "permissions"}
REPOSITORY = "niels-gpt/niels_gpt"


def _yaml(value: Any) -> str:
    """A scalar of ``with:`` or ``env:`` as the runner passes it: a string (``true``, ``0``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise Unsupported(f"a {type(value).__name__} where a string is expected: {value!r}")


@dataclass
class Event:
    name: str  # push or pull_request
    sha: str  # GITHUB_SHA: the pushed commit, or the PR's merge commit
    ref: str
    payload: dict[str, Any]


@dataclass
class JobRun:
    id: str
    name: str
    status: str  # success, failure or skipped
    log: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # every action a step used
    temp: Path | None = None  # RUNNER_TEMP, kept for the test to look into

    def text(self) -> str:
        return "\n".join(self.log)


class Replay:
    """The workflow at ``path`` against the scratch repository ``remote``."""

    def __init__(self, path: Path, remote: Path, scratch: Path, variables: dict[str, str]):
        self.workflow = yaml.safe_load(path.read_text())
        self.remote = remote
        self.scratch = scratch
        self.store = scratch / "cache-store"
        self.vars = variables
        self.runs = 0
        self.lock = threading.Lock()
        unknown = set(self.workflow) - {
            "name",
            "on",
            True,
            "permissions",
            "concurrency",
            "jobs",
            "env",
        }
        if unknown:
            raise Unsupported(f"workflow keys {sorted(map(str, unknown))} are not emulated")

    def triggered(self, event: Event) -> bool:
        on = self.workflow.get("on", self.workflow.get(True))
        spec = on.get(event.name, False) if isinstance(on, dict) else None
        if spec is None:  # "pull_request:" with no filters
            return event.name in on
        branches = spec.get("branches") if isinstance(spec, dict) else None
        return branches is None or event.ref.removeprefix("refs/heads/") in branches

    def run(self, event: Event) -> dict[str, JobRun]:
        """Every job of the workflow on ``event``, one after the other (runs of several
        events may go at once, as on GitHub: each job has its own folders)."""
        if not self.triggered(event):
            raise AssertionError(f"the workflow does not run on {event.name} {event.ref}")
        with self.lock:
            self.runs += 1
            folder = self.scratch / f"run{self.runs}"
        jobs = self.workflow["jobs"].items()
        return {job: self._job(job, spec, event, folder / job) for job, spec in jobs}

    def _contexts(self, event: Event, temp: Path) -> dict[str, Any]:
        github = {
            "event_name": event.name,
            "event": event.payload,
            "sha": event.sha,
            "ref": event.ref,
            "repository": REPOSITORY,
            "workflow": self.workflow.get("name", ""),
        }
        runner = {"os": "Linux", "arch": "X64", "temp": str(temp), "name": "replay"}
        return {"github": github, "vars": dict(self.vars), "runner": runner, "env": {}, "steps": {}}

    def _job(self, job_id: str, spec: dict[str, Any], event: Event, home: Path) -> JobRun:
        unknown = set(spec) - JOB_KEYS
        if unknown:
            raise Unsupported(f"job {job_id}: keys {sorted(unknown)} are not emulated")
        work, temp = home / "work" / "niels_gpt", home / "temp"
        ctx = self._contexts(event, temp)
        ev = Evaluator(ctx, work)
        if not ev.condition(spec.get("if")):
            return JobRun(job_id, job_id, "skipped")
        name = ev.interpolate(str(spec.get("name", job_id)))
        runs_on = ev.interpolate(str(spec["runs-on"]))
        if runs_on != "ubuntu-latest":
            raise Unsupported(
                f"job {job_id} runs on {runs_on!r}: the replay runs ubuntu-latest only"
            )
        for folder in (work, temp, home / "tools"):
            folder.mkdir(parents=True)
        event_file = home / "event.json"
        event_file.write_text(json.dumps(event.payload))
        ctx["env"] = {k: ev.interpolate(_yaml(v)) for k, v in self.workflow.get("env", {}).items()}
        ctx["env"].update({k: ev.interpolate(_yaml(v)) for k, v in spec.get("env", {}).items()})
        run = JobRun(job_id, name, "success", temp=temp)
        base = {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(work),
            "GITHUB_EVENT_NAME": event.name,
            "GITHUB_EVENT_PATH": str(event_file),
            "GITHUB_SHA": event.sha,
            "GITHUB_REF": event.ref,
            "GITHUB_REPOSITORY": REPOSITORY,
            "GITHUB_JOB": job_id,
            "RUNNER_OS": "Linux",
            "RUNNER_ARCH": "X64",
            "RUNNER_TEMP": str(temp),
            "HOME": os.environ.get("HOME", str(home)),
            "LANG": "C.UTF-8",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            # This machine's pip configuration (its package index and wheel folder).
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }
        for i, step in enumerate(spec["steps"]):
            ev.status = "success" if run.status == "success" else "failure"
            label = step.get("name") or step.get("uses") or f"step {i + 1}"
            if not ev.condition(step.get("if")):
                run.log.append(f"--- {label}: skipped (if: {step.get('if')})")
                continue
            run.log.append(f"--- {label}")
            start = time.monotonic()
            ok = self._step(step, label, ev, ctx, base, home, run)
            run.log.append(f"--- {'done' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s")
            if not ok:
                run.status = "failure"
        return run

    def _step(
        self,
        step: dict[str, Any],
        label: str,
        ev: Evaluator,
        ctx: dict[str, Any],
        base: dict[str, str],
        home: Path,
        run: JobRun,
    ) -> bool:
        unknown = set(step) - STEP_KEYS
        if unknown:
            raise Unsupported(f"step {label!r}: keys {sorted(unknown)} are not emulated")
        env = {
            **ctx["env"],
            **{k: ev.interpolate(_yaml(v)) for k, v in step.get("env", {}).items()},
        }
        with_ = {k: ev.interpolate(_yaml(v)) for k, v in step.get("with", {}).items()}
        if "uses" in step:
            action = str(step["uses"])
            if not PINNED.match(action):
                raise Unsupported(f"step {label!r}: {action} is not pinned by a commit SHA")
            run.actions.append(action.split("@")[0])
            outputs = self._action(action.split("@")[0], with_, ev, home, base, run)
            if "id" in step:
                ctx["steps"][step["id"]] = {"outputs": outputs, "outcome": "success"}
            return True
        overridden = [k for k in PIP_INDEX if k in env]
        if overridden:
            run.log.append(PIP_NOTE.format(name=label, vars=" and ".join(overridden)))
            env = {k: v for k, v in env.items() if k not in PIP_INDEX}
        return self._script(step, ev.interpolate(str(step["run"])), {**base, **env}, home, run)

    def _script(
        self, step: dict[str, Any], script: str, env: dict[str, str], home: Path, run: JobRun
    ) -> bool:
        shell = step.get("shell")
        if shell not in (None, "bash"):
            raise Unsupported(f"shell {shell!r} is not emulated")
        flags = ["-e"] if shell is None else ["--noprofile", "--norc", "-eo", "pipefail"]
        files = {
            n: home / f"{n.lower()}.txt" for n in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH")
        }
        for path in files.values():
            path.write_text("")
        script_file = home / "step.sh"
        script_file.write_text(script)
        cwd = Path(env["GITHUB_WORKSPACE"]) / step.get("working-directory", ".")
        done = subprocess.run(
            ["bash", *flags, str(script_file)],
            cwd=cwd,
            env={**env, **{n: str(p) for n, p in files.items()}},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
        run.log += done.stdout.splitlines()
        written = [n for n, p in files.items() if p.read_text().strip()]
        if written:
            raise Unsupported(f"a step wrote {', '.join(written)}: not emulated")
        run.log.append(f"--- exit status {done.returncode}")
        return done.returncode == 0

    # --- actions ---------------------------------------------------------------------

    def _action(
        self,
        name: str,
        with_: dict[str, str],
        ev: Evaluator,
        home: Path,
        base: dict[str, str],
        run: JobRun,
    ) -> dict[str, str]:
        if name == "actions/checkout":
            self._checkout(with_, ev, Path(base["GITHUB_WORKSPACE"]), run)
            return {}
        if name == "actions/setup-python":
            return self._setup_python(with_, home, base, run)
        if name in ("actions/cache/save", "actions/cache/restore"):
            return self._cache(name.rsplit("/", 1)[1], with_, run)
        raise Unsupported(f"action {name} is not emulated")

    def _git(self, cwd: Path, *args: str) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    def _checkout(self, with_: dict[str, str], ev: Evaluator, work: Path, run: JobRun) -> None:
        unknown = set(with_) - {"ref", "path", "fetch-depth", "persist-credentials"}
        if unknown:
            raise Unsupported(f"actions/checkout with {sorted(unknown)} is not emulated")
        if with_.get("persist-credentials") != "false":
            raise Unsupported("actions/checkout must say persist-credentials: false")
        github = ev.contexts["github"]
        ref = with_.get("ref") or (github["sha"] if github["event_name"] == "push" else "")
        if not ref:
            raise Unsupported("a pull_request checkout without ref (the merge commit)")
        dest = work / with_.get("path", ".")
        dest.mkdir(parents=True, exist_ok=True)
        self._git(dest, "init", "-q")
        self._git(dest, "remote", "add", "origin", str(self.remote))
        if with_.get("fetch-depth", "1") == "0":
            self._git(
                dest, "fetch", "-q", "--tags", "origin", "+refs/heads/*:refs/remotes/origin/*"
            )
            self._git(dest, "fetch", "-q", "origin", ref)
        else:
            self._git(dest, "fetch", "-q", "--depth=1", "origin", ref)
        self._git(dest, "checkout", "-q", "--detach", "FETCH_HEAD")
        run.log.append(f"checked out {ref[:12]} into {dest}")

    def _setup_python(
        self, with_: dict[str, str], home: Path, base: dict[str, str], run: JobRun
    ) -> dict[str, str]:
        want = with_.get("python-version", "")
        have = f"{sys.version_info.major}.{sys.version_info.minor}"
        if want != have:
            raise Unsupported(f"setup-python {want!r}: the replay runs Python {have}")
        tools = home / "tools" / "python"
        tools.mkdir(parents=True)
        interpreter = getattr(sys, "_base_executable", sys.executable)
        for link in ("python", "python3"):
            (tools / link).symlink_to(interpreter)
        base["PATH"] = f"{tools}:{base['PATH']}"
        run.log.append(f"python {have}: {interpreter}")
        return {"python-version": have}

    def _cache(self, kind: str, with_: dict[str, str], run: JobRun) -> dict[str, str]:
        allowed = {"path", "key"} | (
            {"lookup-only", "fail-on-cache-miss"} if kind == "restore" else set()
        )
        unknown = set(with_) - allowed
        if unknown:
            raise Unsupported(f"actions/cache/{kind} with {sorted(unknown)} is not emulated")
        path, key = Path(with_["path"]), with_["key"]
        if "\n" in with_["path"] or any(c in with_["path"] for c in "*?~"):
            raise Unsupported(f"cache path {with_['path']!r}: one plain path only")
        stored = self.store / key
        if kind == "save":
            if stored.exists():
                run.log.append(f"cache {key}: already saved, not overwritten")
            elif not path.exists():
                raise AssertionError(f"cache save: {path} does not exist")
            else:
                # Linked, not copied: a save is a job's last use of the path, and a
                # later write replaces a file (a new inode) rather than changing it.
                shutil.copytree(path, stored, symlinks=True, copy_function=os.link)
                run.log.append(f"cache {key}: saved {path}")
            return {}
        if not stored.exists():
            run.log.append(f"cache {key}: miss")
            if with_.get("fail-on-cache-miss") == "true":
                raise AssertionError(f"cache {key}: miss with fail-on-cache-miss")
            return {"cache-hit": "false"}
        if with_.get("lookup-only") != "true":
            shutil.copytree(stored, path, symlinks=True, dirs_exist_ok=True)
        run.log.append(f"cache {key}: hit, restored into {path}")
        return {"cache-hit": "true", "cache-primary-key": key, "cache-matched-key": key}


__all__ = ["Event", "JobRun", "Replay", "Unsupported", "text"]
