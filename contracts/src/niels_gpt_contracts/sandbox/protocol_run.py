"""Start a module-protocol worker and read what it measured: figures, never a verdict.

The worker (``_protocol_worker.py``) is the sandbox interpreter run with
``-I`` in the oracle's user-like environment (``oracle_run``: the code merged
into one ``site-packages``-like folder in a fresh folder of the system's
temporary folder, ``user_like_home``; a scratch ``HOME``). Its report comes
back on a pipe of its own as one JSON document, decoded against
``REPORT_SCHEMA`` (jsonschema), and its outputs as one safetensors blob that
safetensors' own parser reads, each array checked against the dtype the
report names. Anything malformed is ``Answer.problem``, which the caller
judges fail-closed.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from jsonschema import Draft202012Validator, ValidationError  # type: ignore[import-untyped]
from safetensors.numpy import load

from niels_gpt_contracts.sandbox import confine, oracle_run, processes
from niels_gpt_contracts.sandbox.environment import Sandbox

WORKER = "_protocol_worker.py"
MAX_REPORT = 1 << 28  # bytes one worker may send: its report and its outputs

_ERROR = {"type": ["string", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_PROBE = {
    "type": "object",
    "properties": {
        "build": _ERROR,
        "load": _ERROR,
        "input": _ERROR,
        "input_errors": {"type": "array", "items": {"type": "string"}},
        "schema": {
            "type": "object",
            "additionalProperties": {
                "type": "array",
                "prefixItems": [{"type": "array", "items": _COUNT}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        },
        "persistent": {"type": "array", "items": {"type": "string"}},
        "nonpersistent": {"type": "array", "items": {"type": "string"}},
        "trips": {"type": "object", "additionalProperties": _ERROR},
        "hooks": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "additionalProperties": {
                        "type": "array", "items": _COUNT, "minItems": 2, "maxItems": 2
                    },
                },
            ]
        },
        "init": {
            "type": "object",
            "required": ["params", "equal"],
            "properties": {
                "params": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["n", "mean", "std", "seeded"],
                        "properties": {
                            "n": _COUNT,
                            "mean": {"type": "number"},
                            "std": {"type": "number"},
                            "seeded": {"type": "boolean"},
                        },
                    },
                },
                "equal": {
                    "type": "array",
                    "items": {
                        "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2
                    },
                },
            },
        },
        "state": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
        "memory": {
            "oneOf": [
                {"type": "string"},
                {"type": "object", "additionalProperties": _COUNT},
            ]
        },
        "compile": {
            "type": "object",
            "properties": {
                "graphs": _COUNT,
                "breaks": _COUNT,
                "reasons": {"type": "array", "items": {"type": "string"}},
                "error": {"type": "string"},
                "frames": _COUNT,
            },
        },
        "decode": {
            "type": "object",
            "properties": {"graphs": _COUNT, "frames": _COUNT, "error": {"type": "string"}},
            "additionalProperties": False,
        },
    },
    "required": ["build"],
}  # fmt: skip
REPORT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["classes", "defined", "dtypes", "skipped", "fatal"],
    "properties": {
        "classes": {
            "type": "object",
            "additionalProperties": {"type": "object", "additionalProperties": _PROBE},
        },
        "defined": {"type": "object", "additionalProperties": {"type": "string"}},
        "dtypes": {"type": "object", "additionalProperties": {"type": "string"}},
        "skipped": {"type": "object", "additionalProperties": {"type": "string"}},
        "fatal": _ERROR,
        "weights_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
}


@dataclass
class Answer:
    """What one worker measured: its report, its outputs by key, and what went wrong."""

    label: str
    report: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, oracle_run.Output] = field(default_factory=dict)
    problem: str | None = None
    seconds: float = 0.0

    def probe(self, label: str, size: str) -> dict[str, Any] | None:
        found = self.report.get("classes", {}).get(label, {}).get(size)
        return found if isinstance(found, dict) else None


def _parts(raw: bytes) -> tuple[bytes, bytes]:
    """The report and the outputs blob of a worker's answer, each behind its 8-byte length.

    Raises:
        ValueError: lengths that do not add up to the bytes sent.
    """
    if len(raw) < 8:
        raise ValueError(f"an answer of {len(raw)} bytes")
    (n,) = struct.unpack(">Q", raw[:8])
    if len(raw) < 16 + n:
        raise ValueError(f"a report of {n} bytes in an answer of {len(raw)}")
    (m,) = struct.unpack(">Q", raw[8 + n : 16 + n])
    if len(raw) != 16 + n + m:
        raise ValueError(f"outputs of {m} bytes where {len(raw) - 16 - n} came")
    return raw[8 : 8 + n], raw[16 + n :]


def _decode(raw: bytes, answer: Answer) -> None:
    try:
        text, blob = _parts(raw)
        report = json.loads(text)
        Draft202012Validator(REPORT_SCHEMA).validate(report)
    except (ValueError, ValidationError) as err:
        answer.problem = f"unreadable report: {str(err).splitlines()[0][:300]}"
        return
    answer.report = report
    if report["fatal"] is not None:
        return
    try:
        arrays = load(blob)
    except Exception as err:  # safetensors' own error
        answer.problem = f"outputs safetensors cannot read: {str(err)[:200]!r}"
        return
    dtypes: dict[str, str] = report["dtypes"]
    if set(arrays) != set(dtypes):
        answer.problem = "the outputs do not match the tensors the report names"
        return
    for key, dtype in dtypes.items():
        wire = oracle_run.WIRE.get(dtype)
        if wire is None or arrays[key].dtype != np.dtype(wire):
            answer.problem = f"{key!r}: {arrays[key].dtype} on the wire for a {dtype!r} tensor"
            return
        answer.outputs[key] = oracle_run.Output(dtype, arrays[key])


def run(
    box: Sandbox,
    label: str,
    roots: Sequence[Path],
    request: Mapping[str, Any],
    out: Path,
    timeout: float,
) -> Answer:
    """Run one worker over ``roots`` (``packages/*/src`` trees) with ``request``.

    ``out`` is the worker's own folder (created here); the caller reads
    ``weights.safetensors`` from it on the base's side.
    """
    answer = Answer(label)
    chunks: list[bytes] = []

    def read(pipe: BinaryIO, kill: Callable[[], None]) -> None:
        got = 0
        while chunk := pipe.read(1 << 16):
            got += len(chunk)
            if got > MAX_REPORT:
                answer.problem = f"a report of more than {MAX_REPORT} bytes"
                kill()
                return
            chunks.append(chunk)

    home = oracle_run.user_like_home()  # the oracle's: no checker in a module's __file__
    try:
        site = oracle_run.site_folder(roots, home)
        confine.add_readonly(box, [home])
        out.mkdir(parents=True, exist_ok=True)
        request = {**request, "roots": [str(site)], "out": str(out)}
        threads = 1 if label == "base" else None
        ended = oracle_run.launch(box, WORKER, request, threads, read, timeout)
        processes.reap_orphans()
    finally:  # outside the scratch now, so nothing else would remove it
        shutil.rmtree(home, ignore_errors=True)
    answer.seconds = ended.seconds
    answer.problem = ended.timed_out or answer.problem
    if answer.problem is None:
        if not chunks:
            answer.problem = ended.early()
        else:
            _decode(b"".join(chunks), answer)
    return answer
