"""Run the PR's code where it cannot write to what judges it (Linux mount namespaces).

``confined(box, paths)`` returns the sandbox with ``python`` replaced by a
wrapper script in the bootstrap folder. Every process the verdict starts
with the sandbox interpreter (tests, mutants' fork servers, probes, oracle
workers, and whatever they start) then runs in a private mount namespace in
which the listed paths, the system folders (``/usr``, ``/etc``, ``/root``,
``/home``, ``/opt``...) and the interpreter's own prefix are read-only bind
mounts, with every capability dropped from the bounding set and
``no_new_privs`` set before the interpreter starts: as root it cannot remount,
unmount, trace the checker or raise privileges (sudo); as another user, in a
user namespace of its own, likewise. Writes there fail with EROFS, so the
environment, the checker, the workspace's code and tests, the cache and the
checkout stay as they were; what remains writable is scratch space (``/tmp``
outside the listed folders, ``HOME``).

``readonly_list`` names the file the wrapper reads the paths from at each
start, so paths created later (the oracle's code folders) can be added before
their processes start. Where ``unshare``/``setpriv`` are missing or the
kernel refuses namespaces, the sandbox is returned unchanged and ``why`` says
so; the guard's before-and-after snapshots then stand alone.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from niels_gpt_contracts.sandbox.environment import Sandbox

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt", "/root", "/home", "/srv")
MOUNT_FAILED = 97
SCRIPT = """#!/bin/sh
# contracts: the sandbox interpreter, confined (see niels_gpt_contracts/sandbox/confine.py)
exec unshare --mount --propagation private {userns}-- sh -c '
while IFS= read -r p; do
  [ -e "$p" ] || continue
  mount --bind "$p" "$p" && mount -o remount,bind,ro "$p" "$p" || exit {failed}
done < "$0"
shift
exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"' {listing} -- {python} "$@"
"""


def _paths(box: Sandbox, extra: Iterable[str | Path]) -> list[str]:
    prefix = Path(os.path.realpath(box.python)).parent.parent
    wanted = [*SYSTEM, *box.site_paths(), str(prefix), str(Path(box.python).parent.parent)]
    wanted += [str(box.boot), *map(str, extra)]
    out: list[str] = []
    for p in wanted:
        real = os.path.realpath(p)
        if real not in out and (os.path.exists(real) or Path(p).parent == box.boot.parent):
            out.append(real)
    return sorted(out, key=lambda p: (p.count("/"), p))  # parents before children


def confined(box: Sandbox, readonly: Iterable[str | Path]) -> tuple[Sandbox, str]:
    """The sandbox behind read-only mounts, and a line saying how (or why not)."""
    if not sys.platform.startswith("linux"):
        return box, "not confined: mount namespaces are Linux only"
    missing = [tool for tool in ("unshare", "setpriv", "mount") if shutil.which(tool) is None]
    if missing:
        return box, f"not confined: {', '.join(missing)} not found"
    listing = box.boot.parent / "readonly.list"
    wrapper = box.boot.parent / "python"
    paths = _paths(box, [*readonly, wrapper, listing])
    listing.write_text("\n".join(paths) + "\n", encoding="utf-8")
    userns = "" if os.geteuid() == 0 else "--map-root-user "
    wrapper.write_text(
        SCRIPT.format(
            userns=userns,
            failed=MOUNT_FAILED,
            listing=shlex.quote(str(listing)),
            python=shlex.quote(box.python),
        ),
        encoding="utf-8",
    )
    wrapper.chmod(0o555)
    try:
        done = subprocess.run(
            [str(wrapper), "-I", "-c", "print('confined')"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return box, f"not confined: the namespace could not start ({err})"
    if done.returncode != 0 or done.stdout.strip() != "confined":
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return box, f"not confined: the namespace could not start ({tail[:200]})"
    how = "root" if not userns else "a user namespace"
    # The wrapper and its list sit beside the bootstrap folder, read-only inside.
    return replace(
        box, python=str(wrapper), readonly=listing
    ), f"confined ({how}, read-only mounts)"


def add_readonly(box: Sandbox, paths: Iterable[str | Path]) -> None:
    """Make ``paths`` read-only too for processes started from now on."""
    if box.readonly is None:
        return
    known = box.readonly.read_text(encoding="utf-8").splitlines()
    more = [os.path.realpath(p) for p in paths]
    box.readonly.write_text("\n".join([*known, *more]) + "\n", encoding="utf-8")
