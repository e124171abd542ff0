"""The sandbox environment is data the checker verifies, before and after each use.

``build`` wraps ``environment.build``: a freshly built environment is sealed
at once, before any PR's code ran (``<env>.manifest.json`` beside it: every
file and link of the environment, interpreter and ``pyvenv.cfg`` included,
with its size, SHA-256 or link target, and its inode, mtime and ctime). Each
later verdict verifies the environment against its seal before using it:
``lstat`` first; where anything differs, the contents. A change in content
means something wrote into the environment since it was built (a verdict
that died before its guard could look, say): the entry is discarded and
built again, never used. Restored caches (new inodes and times, same bytes)
are re-sealed.

During a verdict the guard watches the whole environment (``Sandbox
.trusted_paths``) and, where ``confine`` works, the PR's code cannot write to
it at all; a change is ``sandbox.tampered`` and the entry is discarded.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

from niels_gpt_contracts.decoding import Malformed, decode
from niels_gpt_contracts.digests import file_digest
from niels_gpt_contracts.sandbox import environment

MANIFEST_VERSION: Literal[1] = 1


class _Entry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One sealed file: ``stat`` is (size, mtime_ns, ctime_ns, inode); a link's
    target or a file's SHA-256 (read only when the contents are asked for)."""

    stat: tuple[int, int, int, int]
    link: str | None = None
    sha256: str | None = None


class _Manifest(msgspec.Struct, frozen=True):
    """``<env>.manifest.json``: every file and link of the environment by relative path."""

    version: Literal[1]
    files: dict[str, _Entry]


def _entry(path: Path, content: bool) -> _Entry:
    st = path.lstat()
    stat = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if path.is_symlink():
        return _Entry(stat, link=os.readlink(path))
    return _Entry(stat, sha256=file_digest(path) if content else None)


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder)
        found += [base / name for name in files]
        found += [base / name for name in dirs if (base / name).is_symlink()]
    return sorted(found)


def manifest_path(env_dir: Path) -> Path:
    return env_dir.parent / f"{env_dir.name}.manifest.json"


def seal(env_dir: Path) -> None:
    """Record every file of ``env_dir`` (contents included) beside it."""
    files = {str(p.relative_to(env_dir)): _entry(p, True) for p in _walk(env_dir)}
    target = manifest_path(env_dir)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(msgspec.json.encode(_Manifest(MANIFEST_VERSION, files)))
    os.replace(tmp, target)


def verify(env_dir: Path) -> list[str]:
    """Paths (relative to ``env_dir``) whose content differs from the seal; ``[]`` if none.

    A missing or unreadable seal, or one of another shape or version, counts as
    a difference (``<manifest>``).
    """
    try:
        raw = manifest_path(env_dir).read_bytes()
        sealed = decode(raw, _Manifest, "expected an environment's seal").files
    except (OSError, Malformed):
        return ["<manifest>"]
    now = {str(p.relative_to(env_dir)): p for p in _walk(env_dir)}
    changed = sorted(set(now) ^ set(sealed))
    restat = False
    for rel in sorted(set(now) & set(sealed)):
        if _entry(now[rel], False).stat == sealed[rel].stat:
            continue
        restat = True
        full = _entry(now[rel], True)
        same = (full.sha256, full.link) == (sealed[rel].sha256, sealed[rel].link)
        if not same or full.stat[0] != sealed[rel].stat[0]:
            changed.append(rel)
    if restat and not changed:
        seal(env_dir)  # same bytes, new inodes or times (a restored cache)
    return changed


def build(cache: Path, constraints: str, say: Callable[[str], None]) -> str:
    """``environment.build``, sealed when new and verified when reused; its interpreter."""
    env_dir = cache / "envs" / environment.fingerprint(constraints)
    fresh = not (env_dir / "niels-gpt-ready").is_file()
    python = environment.build(cache, constraints, say)
    if fresh or not manifest_path(env_dir).is_file():
        seal(env_dir)
        return python
    changed = verify(env_dir)
    if changed:
        say(
            f"the sandbox environment changed since it was sealed ({changed[0]}, "
            f"{len(changed)} path(s)): discarded and built again"
        )
        discard(env_dir)
        python = environment.build(cache, constraints, say)
        seal(env_dir)
    return python


def discard(env_dir: Path) -> None:
    """Remove an environment and its seal."""
    shutil.rmtree(env_dir, ignore_errors=True)
    manifest_path(env_dir).unlink(missing_ok=True)
