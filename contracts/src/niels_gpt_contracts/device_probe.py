"""Is a torch device really usable? Ask it to compute, not the driver.

``torch.backends.mps.is_available()`` and ``torch.cuda.is_available()`` can say
yes on machines where the first allocation then fails (GitHub's macOS arm64
runners: "MPS backend out of memory ... max allowed: 7.93 GB"), or hangs. So
``probe(kind)`` runs, in a separate Python process with a time limit, the least
a test run needs: the availability check, one allocation on the device, a
small matmul + softmax there, and a comparison with the same computation on
the CPU. The verdict is a ``ProbeResult(ok, reason)``; ``reason`` is one line
naming the step that failed (or what succeeded).

The probing process imports only torch, from whatever interpreter ``python``
names (the environment the tests will use); this module imports nothing from
the rest of the checker but ``decoding`` (the verdict line is decoded by type),
so a noxfile or the gate can run it on its own.

Command line: ``python -m niels_gpt_contracts.device_probe KIND [--python P]
[--timeout S]`` prints one line, ``KIND: usable: ...`` or ``KIND: unusable:
reason``, and exits 0 when usable, 1 when not, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

import msgspec

from niels_gpt_contracts.decoding import Malformed, decode, last_line

__all__ = ["KINDS", "ProbeResult", "probe"]

KINDS = ("cpu", "mps", "cuda")
DEFAULT_TIMEOUT_S = 120.0
_REASON_LIMIT = 300

# Run by the probing interpreter as ``python -c _CHILD KIND``. It prints one JSON
# object {"ok": bool, "reason": str} as its last line. Inputs are scaled so the
# scores are of order one; 1e-3 admits TF32-class matmuls, and a wrong kernel
# is off by far more.
_CHILD = r"""
import json, sys

def done(ok, reason):
    print(json.dumps({"ok": ok, "reason": reason}), flush=True)
    raise SystemExit(0)

def first_line(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"

kind = sys.argv[1]
try:
    import torch
except Exception as err:
    done(False, "cannot import torch: " + first_line(err))
version = getattr(torch, "__version__", "?")
if kind == "cuda" and not torch.cuda.is_available():
    done(False, f"torch {version}: torch.cuda.is_available() is False")
if kind == "mps":
    if not torch.backends.mps.is_built():
        done(False, f"torch {version} is built without MPS")
    if not torch.backends.mps.is_available():
        done(False, f"torch {version}: torch.backends.mps.is_available() is False")
step = "allocating on the device"
try:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=gen) / 8.0
    b = torch.randn(64, 64, generator=gen)
    a_dev, b_dev = a.to(kind), b.to(kind)
    step = "matmul + softmax on the device"
    out = torch.softmax(a_dev @ b_dev, dim=-1)
    step = "copying the result back"
    got = out.cpu()
except Exception as err:
    done(False, f"{step} failed: {first_line(err)}")
want = torch.softmax(a @ b, dim=-1)
error = float((got - want).abs().max())
if not error <= 1e-3:
    done(False, f"matmul + softmax differ from the CPU by {error:.3g} (allowed 1e-3)")
done(True, f"torch {version}: allocation, matmul + softmax agree with the CPU to {error:.1e}")
"""


@dataclass(frozen=True)
class ProbeResult:
    """The verdict on one device kind: usable or not, and why, in one line."""

    ok: bool
    reason: str


class _Verdict(msgspec.Struct, frozen=True):
    """The probing process's last line (``_CHILD``'s ``done``)."""

    ok: bool
    reason: str


def _one_line(text: str) -> str:
    """Printable, single-line, bounded: the probed process's words are not trusted."""
    flat = " ".join(text.split())
    safe = "".join(ch if ch.isprintable() else "?" for ch in flat)
    return safe if len(safe) <= _REASON_LIMIT else safe[: _REASON_LIMIT - 3] + "..."


def probe(
    kind: str, python: str = sys.executable, timeout: float = DEFAULT_TIMEOUT_S
) -> ProbeResult:
    """Check that ``kind`` computes correctly in a fresh ``python`` within ``timeout`` s.

    Args:
        kind: ``"cpu"``, ``"mps"`` or ``"cuda"``.
        python: the interpreter whose torch is probed (the test environment's).
        timeout: seconds before the probe counts the device as hung.

    Returns:
        ``ProbeResult(ok, reason)``; never raises for a broken or absent device.

    Raises:
        ValueError: an unknown ``kind`` or a non-positive ``timeout``.
    """
    if kind not in KINDS:
        raise ValueError(f"device kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    try:
        done = subprocess.run(
            [python, "-c", _CHILD, kind],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(
            False, f"{kind} probe gave no answer within {timeout:g} s (hung device?)"
        )
    except OSError as err:
        return ProbeResult(False, _one_line(f"cannot run {python!r}: {err.strerror or err}"))
    last = last_line(done.stderr) or "no output"
    if done.returncode != 0:
        return ProbeResult(
            False, _one_line(f"{kind} probe died (exit status {done.returncode}): {last}")
        )
    try:
        verdict = decode(last_line(done.stdout), _Verdict, "expected a verdict")
    except Malformed as err:
        return ProbeResult(False, _one_line(f"{kind} probe gave no verdict ({err}): {last}"))
    return ProbeResult(verdict.ok, _one_line(verdict.reason))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m niels_gpt_contracts.device_probe",
        description="Probe a torch device by computing on it (exit 0 usable, 1 not).",
    )
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--python", default=sys.executable, help="interpreter to probe with")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    result = probe(args.kind, python=args.python, timeout=args.timeout)
    status = "usable" if result.ok else "unusable"
    print(f"{args.kind}: {status}: {result.reason}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
