"""Run the PR's code where it cannot write to what judges it (Linux mount namespaces).

``confined(box, paths)`` returns the sandbox with ``python`` replaced by a
wrapper script in the sandbox's scratch folder. Every process the verdict
starts with the sandbox interpreter (tests, mutants' fork servers, probes,
oracle workers, and whatever they start) then runs in a private mount
namespace in which the listed paths, the system folders (``/usr``, ``/etc``,
``/root``, ``/home``, ``/opt``...), the interpreter's own prefix, the
directory the verdict was started from, the user's home and the temporary
folders (``/tmp``, ``/var/tmp``, ``$TMPDIR``) are read-only bind mounts, with
the sandbox's scratch folder (``box.root``: ``HOME``, ``TMPDIR`` and every
cache of the runs, see ``environment.scratch_vars``) bound writable again
below them; every capability is dropped from the bounding set and
``no_new_privs`` set before the interpreter starts: as root it cannot
remount, unmount, trace the checker or raise privileges (sudo); as another
user, in a user namespace of its own, likewise. Writes elsewhere fail with
EROFS, so the environment, the checker, the workspace's code and tests, the
cache, the checkout, the invoking directory and the user's home stay as they
were.

"confined" is a claim checked by doing: once the namespace starts, the
sandbox interpreter tries to create a file in each place that must be
read-only (``must_refuse``) and in its scratch folder; a write that
succeeds where it must not is a ``ConfigError`` (exit 2, no verdict), and so
is a scratch folder it cannot write.

``readonly_list`` names the file the wrapper reads the paths from at each
start (``ro PATH`` or ``rw PATH`` a line, parents before children), so paths
created later (the oracle's code folders) can be added before their
processes start. Where ``unshare``/``setpriv`` are missing or the kernel
refuses namespaces, the sandbox is returned unchanged and ``why`` says so;
the guard's before-and-after snapshots and the scratch variables then stand
alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from niels_gpt_contracts.decoding import Malformed, decode, last_line, one_line
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.sandbox.environment import Sandbox

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt", "/root", "/home", "/srv")
TEMPORARY = ("/tmp", "/var/tmp")
MOUNT_FAILED = 97
# Each line of the list: "ro PATH" or "rw PATH". A recursive bind keeps the
# mounts below a path visible; the remount changes only the path's own mount.
SCRIPT = """#!/bin/sh
# contracts: the sandbox interpreter, confined (see niels_gpt_contracts/sandbox/confine.py)
exec unshare --mount --propagation private {userns}-- sh -c '
while IFS=" " read -r mode p; do
  [ -e "$p" ] || continue
  mount --rbind "$p" "$p" && mount -o "remount,bind,$mode" "$p" "$p" || exit {failed}
done < "$0"
shift
exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"' {listing} -- {python} "$@"
"""


def must_refuse(readonly: Iterable[str | Path]) -> list[str]:
    """The places the PR's code must not write, besides the system folders: ``readonly``
    (the caller's: checker, environment, workspace, cache, checkout), the directory
    the verdict was started from, the user's home and the temporary folders."""
    places = [*map(str, readonly), str(Path.home()), tempfile.gettempdir(), *TEMPORARY]
    with contextlib.suppress(OSError):  # a folder removed since: nothing there to protect
        places.append(os.getcwd())
    return places


def _lines(box: Sandbox, extra: Iterable[str | Path]) -> list[str]:
    """The wrapper's list: ``ro``/``rw`` and a real path a line, parents before children.

    The scratch folder is writable below everything read-only above it (it
    usually lives in ``/tmp``); what inside it must stay as it is (the
    bootstrap, the workspace's code, the wrapper) is read-only below that.
    ``/`` itself is never bound (that would hide every other mount).
    """
    prefix = Path(os.path.realpath(box.python)).parent.parent
    wanted = [*SYSTEM, *box.site_paths(), str(prefix), str(Path(box.python).parent.parent)]
    wanted += [str(box.boot), *map(str, extra)]
    scratch = os.path.realpath(box.root)
    out: dict[str, str] = {}
    for p in wanted:
        real = os.path.realpath(p)
        if real == "/" or real == scratch:
            continue
        if real not in out and (os.path.exists(real) or Path(p).parent == box.root):
            out[real] = "ro"
    out[scratch] = "rw"
    order = sorted(out, key=lambda p: (p.count("/"), p))
    return [f"{out[p]} {p}" for p in order]


# Run by the confined interpreter: try to create a file in each place; print
# the places where it worked (and remove the file again).
PROBE = """
import json, os, sys
name = ".contracts-write-probe-%d" % os.getpid()
wrote = []
for place in json.loads(sys.argv[1]):
    path = os.path.join(place, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        continue
    os.close(fd)
    os.unlink(path)
    wrote.append(place)
print(json.dumps(wrote))
"""


def _check_writes(wrapper: Path, box: Sandbox, refuse: list[str]) -> None:
    """Write from inside the namespace; ``ConfigError`` where it is not what we claim."""
    places = [p for p in dict.fromkeys(os.path.realpath(p) for p in refuse) if os.path.isdir(p)]
    scratch = str(box.tmp)
    done = subprocess.run(
        [str(wrapper), "-I", "-c", PROBE, json.dumps([*places, scratch])],
        cwd=box.home,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **box.scratch_vars()},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        wrote = decode(last_line(done.stdout), list[str], "expected the places written to")
    except Malformed as err:
        tail = one_line(last_line(done.stderr) or "no output", 200)
        raise ConfigError(
            f"the confinement check gave no answer (exit {done.returncode}, {err}): {tail}"
        ) from None
    escaped = [p for p in wrote if p != scratch]
    if escaped:
        raise ConfigError(
            "the sandbox claims read-only mounts, but a write from inside succeeded in "
            f"{', '.join(escaped[:5])}: expected every one refused (EROFS)"
        )
    if scratch not in wrote:
        raise ConfigError(
            f"the confined sandbox cannot write its own scratch folder {scratch}: expected "
            "it writable below the read-only mounts"
        )


def confined(box: Sandbox, readonly: Iterable[str | Path]) -> tuple[Sandbox, str]:
    """The sandbox behind read-only mounts, and a line saying how (or why not).

    Raises:
        ConfigError: the namespace started, but a write to a place that must be
            read-only succeeded from inside it (or the scratch folder refused one).
    """
    if not sys.platform.startswith("linux"):
        return box, "not confined: mount namespaces are Linux only"
    missing = [tool for tool in ("unshare", "setpriv", "mount") if shutil.which(tool) is None]
    if missing:
        return box, f"not confined: {', '.join(missing)} not found"
    listing = box.root / "readonly.list"
    wrapper = box.root / "python"
    refuse = must_refuse(readonly)
    lines = _lines(box, [*refuse, wrapper, listing])
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    userns = "" if os.geteuid() == 0 else "--map-root-user "
    wrapper.unlink(missing_ok=True)  # read-only (0o555) when confined once before
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
            cwd=box.home,
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
    _check_writes(wrapper, box, [*refuse, str(wrapper.parent / "boot")])
    how = "root" if not userns else "a user namespace"
    # The wrapper and its list sit beside the bootstrap folder, read-only inside.
    return replace(
        box, python=str(wrapper), readonly=listing
    ), f"confined ({how}, read-only mounts; writes outside its scratch refused)"


def add_readonly(box: Sandbox, paths: Iterable[str | Path]) -> None:
    """Make ``paths`` read-only too for processes started from now on."""
    if box.readonly is None:
        return
    known = box.readonly.read_text(encoding="utf-8").splitlines()
    more = [f"ro {os.path.realpath(p)}" for p in paths]
    box.readonly.write_text("\n".join([*known, *more]) + "\n", encoding="utf-8")
