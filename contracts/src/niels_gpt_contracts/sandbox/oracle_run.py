"""Start oracle workers and read their answers: tensors, never a verdict.

A worker (``_oracle_worker.py``) is the sandbox interpreter run with ``-I``
in a user-like environment: the caller's ``PATH`` and locale, ``HOME``,
``TMPDIR`` and the cache locations in the sandbox's scratch folder
(``Sandbox.scratch_vars``), ``OMP_WAIT_POLICY=PASSIVE``, and nothing else
(no pytest or sandbox variable, no thread pin, a random hash seed). The code
under check is copied into one ``site-packages``-like folder, merged the way
installed wheels are, in a fresh folder of the system's temporary folder
(``user_like_home``), so a stage's ``__file__`` looks like a user's install.
The request, with the secret seed, goes over stdin; answers come back as
frames on a separate pipe.

Frames are validated here: each header decoded by msgspec into its frame
type (``Frame``: kinds, fields, types, counts), a call's tensors by
safetensors' parser (offsets, shapes, byte counts), then each array's dtype
against the one the header names. Anything
malformed makes the whole stream unreadable (``Stream.problem``), which the
caller judges fail-closed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

import msgspec
import numpy as np
from safetensors.numpy import load as load_arrays

from niels_gpt_contracts.decoding import Malformed, decode, one_line
from niels_gpt_contracts.sandbox import confine, processes
from niels_gpt_contracts.sandbox.environment import PASSED_THROUGH, Sandbox, Snapshot

WORKER = "_oracle_worker.py"
MAX_HEADER = 1 << 25  # an ops frame lists the ops of every watched call
MAX_TOTAL = 1 << 30  # bytes of tensors one worker may send
# A torch dtype's values on the wire, as the numpy dtype safetensors gives them back in
# (``_oracle_kit.encode``: bfloat16 and float16 widened exactly, bool as bytes).
WIRE = {
    **{name: name for name in ("float64", "float32", "int64", "int32", "int16", "int8", "uint8")},
    "bfloat16": "float32",
    "float16": "float32",
    "bool": "uint8",
}


class Unreadable(ValueError):
    """A frame that breaks the protocol."""


@dataclass(frozen=True)
class Output:
    """One tensor a call returned: its dtype as torch named it, and its values."""

    dtype: str
    data: np.ndarray[Any, Any]


@dataclass
class Call:
    """One call's answer (see ``_oracle_kit.Oracle.call``)."""

    stage: str
    name: str
    desc: str
    stages: int
    reduction: int
    rules: tuple[str, ...]
    relations: tuple[Mapping[str, Any], ...]
    compare: tuple[str, ...] | None
    computes_in: str | None
    error: str | None
    message: str
    values: Mapping[str, Any]
    casts: tuple[str, ...]
    outputs: dict[str, Output]
    axes: tuple[str, ...] = ()  # the spec's domain axes the driver says this call sweeps
    after: Mapping[str, Any] | None = None  # what it left behind (``_oracle_aftermath``)


@dataclass(frozen=True)
class Held:
    """Bytes of storage a driver's objects held after its calls (``Oracle.held``)."""

    desc: str
    bytes: int


@dataclass
class Stream:
    """Everything one worker sent, in order, and what went wrong with it."""

    label: str
    calls: dict[tuple[str, str], Call] = field(default_factory=dict)
    ops: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    driver_errors: dict[str, str] = field(default_factory=dict)
    fatal: str | None = None
    problem: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Job:
    """One worker to start: its label, code roots, request and thread pin (None: default)."""

    label: str
    roots: Sequence[Path]
    request: Mapping[str, Any]
    threads: int | None = None


def _read_exact(pipe: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = pipe.read(n - got)
        if not chunk:
            raise Unreadable(f"the stream ended inside a frame ({got} of {n} bytes)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


Count = Annotated[int, msgspec.Meta(ge=0)]
# The dtypes a header may name: WIRE's keys.
WireDtype = Literal[
    "float64", "float32", "int64", "int32", "int16", "int8", "uint8", "bfloat16", "float16", "bool"
]


class Tensors(msgspec.Struct, frozen=True):
    """A call's tensors: the dtype torch named each with, and the blob's byte count."""

    dtypes: dict[str, WireDtype]
    nbytes: Count


class _Frame(msgspec.Struct, tag_field="kind"):
    """One frame's JSON header; ``kind`` picks the type."""


class DoneFrame(_Frame, tag="done"):
    pass


class FatalFrame(_Frame, tag="fatal"):
    error: str


class DriverErrorFrame(_Frame, tag="driver-error"):
    stage: str
    error: str


class HeldFrame(_Frame, tag="held"):
    stage: str
    call: str
    desc: str
    bytes: Count


class OpsFrame(_Frame, tag="ops"):
    stage: str
    ops: dict[str, list[str]]


class CallFrame(_Frame, tag="call"):
    """A call's header (``_oracle_kit.Oracle.call``); its blob follows."""

    stage: str
    call: str
    stages: Count
    reduction: Count
    tensors: Tensors
    desc: str = ""
    rules: list[str] = []
    relations: list[dict[str, Any]] = []
    compare: list[str] | None = None
    computes_in: WireDtype | None = None
    error: str | None = None
    message: str = ""
    values: dict[str, Any] = {}
    casts: list[str] = []
    axes: list[str] = []
    after: dict[str, Any] | None = None


Frame = DoneFrame | FatalFrame | DriverErrorFrame | HeldFrame | OpsFrame | CallFrame


def _outputs(pipe: BinaryIO, tensors: Tensors, budget: list[int]) -> dict[str, Output]:
    """Read a call's safetensors blob; its arrays, each as the dtype the header names."""
    budget[0] -= tensors.nbytes
    if budget[0] < 0:
        raise Unreadable(f"more than {MAX_TOTAL} bytes of tensors")
    blob = _read_exact(pipe, tensors.nbytes)
    try:
        arrays = load_arrays(blob)
    except Exception as err:  # safetensors' own error, or numpy's for a dtype it lacks
        raise Unreadable(f"tensors safetensors cannot read: {str(err)[:200]!r}") from None
    if set(arrays) != set(tensors.dtypes):
        named = sorted(tensors.dtypes)
        raise Unreadable(f"the tensors {sorted(arrays)!r} where {named!r} were named")
    out: dict[str, Output] = {}
    for key, dtype in tensors.dtypes.items():
        if arrays[key].dtype != np.dtype(WIRE[dtype]):
            raise Unreadable(f"{key!r}: {arrays[key].dtype} on the wire for a {dtype!r} tensor")
        out[key] = Output(dtype, arrays[key])
    return out


def _call(head: CallFrame, outputs: dict[str, Output]) -> Call:
    return Call(
        stage=head.stage,
        name=head.call,
        desc=head.desc,
        stages=max(1, head.stages),
        reduction=max(1, head.reduction),
        rules=tuple(head.rules),
        relations=tuple(head.relations),
        compare=None if head.compare is None else tuple(head.compare),
        computes_in=head.computes_in,
        error=head.error,
        message=head.message,
        values=head.values,
        casts=tuple(head.casts),
        outputs=outputs,
        axes=tuple(head.axes),
        after=head.after,
    )


def read_stream(pipe: BinaryIO, stream: Stream) -> bool:
    """Read frames into ``stream`` until ``done``; whether ``done`` came.

    Raises:
        Unreadable: a frame that breaks the protocol (its reason on one line).
    """
    budget = [MAX_TOTAL]
    while True:
        raw = pipe.read(4)
        if not raw:
            return False
        if len(raw) < 4:
            raw += _read_exact(pipe, 4 - len(raw))
        (size,) = struct.unpack(">I", raw)
        if size > MAX_HEADER:
            raise Unreadable(f"a frame header of {size} bytes")
        try:
            head: Frame = decode(_read_exact(pipe, size), Frame, "a frame header")
        except Malformed as err:
            raise Unreadable(str(err)) from None
        if isinstance(head, DoneFrame):
            return True
        if isinstance(head, FatalFrame):
            stream.fatal = head.error
        elif isinstance(head, DriverErrorFrame):
            stream.driver_errors[head.stage] = head.error
        elif isinstance(head, HeldFrame):
            key = (head.stage, head.call)
            if key in stream.held:
                raise Unreadable(f"the held figure {one_line(key[0])}/{one_line(key[1])} twice")
            stream.held[key] = Held(head.desc, head.bytes)
        elif isinstance(head, OpsFrame):
            stream.ops[head.stage] = {c: tuple(names) for c, names in head.ops.items()}
        else:
            call = _call(head, _outputs(pipe, head.tensors, budget))
            if (call.stage, call.name) in stream.calls:
                raise Unreadable(f"the call {one_line(call.stage)}/{one_line(call.name)} twice")
            stream.calls[(call.stage, call.name)] = call


def user_like_home() -> Path:
    """A fresh folder of the system's temporary folder, for one worker's copy of the code.

    Not under the sandbox's scratch, where the worker's ``HOME`` and ``TMPDIR``
    are: that path names the checker (``contracts-pr-...``, ``sandbox``), and a
    stage module's ``__file__`` would carry it into the worker, for code that
    behaves only when no checker is in sight to read (the scenario
    ``test_code_that_tells_a_test_run_from_a_user_is_caught``). The workers
    only read it (``confine.add_readonly``); the trusted side removes it.
    """
    return Path(tempfile.mkdtemp())


def site_folder(roots: Sequence[Path], dest: Path) -> Path:
    """The ``packages/*/src`` trees merged into ``dest/lib/python3/site-packages``."""
    site = dest / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for root in roots:
        shutil.copytree(root, site, dirs_exist_ok=True)
    return site


def _environ(box: Sandbox, threads: int | None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.update(box.scratch_vars())
    # Idle OpenMP threads sleep instead of spinning: with two workers and other
    # jobs on few cores, spinning costs several times the work. No API the
    # stages may use can read it (torch.get_num_threads() is the default).
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    if threads is not None:  # the base's and the reference's workers only
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


@dataclass(frozen=True)
class Ended:
    """How a worker ended (``launch``): its timeout, exit status, stderr's last line, time."""

    timed_out: str | None
    returncode: int | None
    tail: str
    seconds: float

    def early(self) -> str:
        """The problem of a worker that ended before its answer was complete."""
        return f"the worker ended early (exit {self.returncode}): {self.tail[:300]}"


def launch(
    box: Sandbox,
    worker: str,
    request: Mapping[str, Any],
    threads: int | None,
    read: Callable[[BinaryIO, Callable[[], None]], None],
    timeout: float,
) -> Ended:
    """Run the sandbox-side script ``worker`` with ``python -I`` in the user-like
    environment (``_environ``), ``request`` as JSON on stdin with ``fd`` added: a pipe
    that ``read(pipe, kill)`` drains in a thread (``kill`` ends the worker's process
    group, for an answer it refuses). Tracked and reaped like every sandboxed run."""
    read_fd, write_fd = os.pipe()
    full = {**request, "fd": write_fd}
    script = Path(box.boot) / "niels_gpt_contracts" / "sandbox" / worker
    start = time.monotonic()
    processes.refuse_if_ended()
    proc = subprocess.Popen(
        [box.python, "-I", str(script)],
        env=_environ(box, threads),
        cwd=box.home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(write_fd,),
        start_new_session=True,
    )
    os.close(write_fd)

    def reader() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            read(pipe, lambda: processes.kill_group(proc.pid))

    thread = threading.Thread(target=reader, daemon=True)
    timed_out = None
    with processes.tracked(proc.pid):
        thread.start()
        try:
            _, err = proc.communicate(json.dumps(full).encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            processes.kill_group(proc.pid)
            _, err = proc.communicate()
            timed_out = f"timed out after {timeout:g} s"
        processes.kill_group(proc.pid)
        thread.join(timeout=30)
    tail = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
    return Ended(timed_out, proc.returncode, tail, time.monotonic() - start)


def _run(box: Sandbox, job: Job, site: Path, timeout: float) -> Stream:
    stream = Stream(job.label)
    done: list[bool] = []

    def read(pipe: BinaryIO, kill: Callable[[], None]) -> None:
        try:
            done.append(read_stream(pipe, stream))
        except Unreadable as err:
            stream.problem = f"unreadable answer: {err}"
            kill()

    request = {**job.request, "roots": [str(site)]}
    ended = launch(box, WORKER, request, job.threads, read, timeout)
    stream.seconds = ended.seconds
    stream.problem = ended.timed_out or stream.problem
    if stream.problem is None and not done:
        stream.problem = ended.early()
    return stream


def run(
    box: Sandbox, jobs: Sequence[Job], timeout: float, watched: Sequence[Path] = ()
) -> tuple[list[Stream], list[str]]:
    """Run every job at once (one thread each): their streams in order, and tampering.

    Each job's code is copied into a fresh temporary folder that looks like a
    virtual environment (no trace of the checker in a module's ``__file__``).
    The second value lists the files under those folders and ``watched`` that
    changed while the workers ran (the PR's worker writing into the base's
    code, say); the folders are removed afterwards.
    """
    results: list[Stream | None] = [None] * len(jobs)
    homes = [user_like_home() for _ in jobs]
    try:
        sites = [site_folder(j.roots, home) for j, home in zip(jobs, homes, strict=True)]
        confine.add_readonly(box, homes)  # no worker writes into another's code
        before = Snapshot.take([*homes, *watched])

        def one(i: int) -> None:
            results[i] = _run(box, jobs[i], sites[i], timeout)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        processes.reap_orphans()  # once all are done: a worker starting is not yet tracked
        changed = before.changes(Snapshot.take([*homes, *watched]))
    finally:  # outside the scratch, so nothing else would remove them
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
    streams = [
        r if r is not None else Stream(j.label, problem="no answer")
        for r, j in zip(results, jobs, strict=True)
    ]
    return streams, changed
