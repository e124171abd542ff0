"""What the amendment tests share: alpha's spec edited and committed, and the verdict read.

Each helper works on ``gatekit``'s alpha/beta monorepo; ``judge`` runs
``contracts check --base main --head HEAD`` and ``row`` picks one stage's
amendment outcome from its JSON report.
"""

from __future__ import annotations

from gatekit import Repo

ALPHA = "specs/alpha.toml"


def amend(repo: Repo, old: str, new: str, version: str | None = None, *trailers: str) -> None:
    """Replace ``old`` by ``new`` in alpha's spec, set its version, commit with trailers."""
    if old:
        repo.replace(ALPHA, old, new)
    if version is not None:
        repo.replace(ALPHA, 'version = "1.0.0"', f'version = "{version}"')
    repo.commit("amend alpha\n\n" + "\n".join(trailers or ("Spec: alpha",)))


def judge(repo: Repo, *extra: str) -> tuple[int, dict[str, object]]:
    """The exit code and JSON report of the amendment range ``main..HEAD``."""
    return repo.gate_json("--no-api", "--base", "main", "--head", "HEAD", *extra)


def row(out: dict[str, object], stage: str = "alpha") -> dict[str, str]:
    """The one ``amendment`` outcome of ``stage`` in a JSON report."""
    rows = [o for o in out["outcomes"] if o["check"] == "amendment" and o["stage"] == stage]  # type: ignore[attr-defined,index]
    assert len(rows) == 1, out
    return rows[0]  # type: ignore[no-any-return]
