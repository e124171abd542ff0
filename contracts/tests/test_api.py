"""The import-based API check (the modules here need no torch)."""

from __future__ import annotations

import pytest
from gatekit import Repo

ALPHA_MOD = "packages/alpha/src/ngx/alpha_mod.py"
PR = ("--stage", "alpha", "--base", "main", "--head", "HEAD")


def api_violations(out: dict[str, object]) -> list[dict[str, object]]:
    return [v for v in out["violations"] if v["check"] == "api"]  # type: ignore[attr-defined,index]


def test_tree_api_matches(repo: Repo) -> None:
    code, out = repo.gate_json()
    assert code == 0, out["violations"]
    assert {o["check"] for o in out["outcomes"]} == {
        "spec",
        "api",
        "modules",
        "source",
        "static",
        "invariants",
        "stages",
    }


def test_string_annotation_spelling_does_not_matter(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "label: str | None = None", "label: 'str|None' = None")
    code, out = repo.gate_json()
    assert code == 0, out["violations"]


def test_changed_default_fails_in_pr_gate(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "turns: int = 1,", "turns: int = 2,")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    (v,) = api_violations(out)
    assert v["rule"] == "api.signature"
    assert v["path"] == ALPHA_MOD
    assert v["line"] == 11
    assert "expected default 1, found 2" in str(v["message"])


def test_kind_and_annotation_changes_fail(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "*, turns: int = 1", "turns: float = 1")
    repo.replace(ALPHA_MOD, "def run(self, x: float, *, fast", "def run(self, x: float, *, quick")
    code, out = repo.gate_json()
    assert code == 1
    messages = " | ".join(str(v["message"]) for v in api_violations(out))
    assert "parameter 'turns': expected keyword-only, found positional-or-keyword" in messages
    assert "parameter 'turns': expected annotation int, found float" in messages
    assert "run: expected parameters (self, x, fast), found (self, x, quick)" in messages


def test_missing_object_and_extra_export_fail(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "def rotate(", "def spin(")
    repo.replace(
        ALPHA_MOD,
        "    n = turns",
        "    n = turns\n    return spin(x)\n\n\ndef helper():\n    n = 0",
    )
    code, out = repo.gate_json()
    assert code == 1
    found = {v["rule"] for v in api_violations(out)}
    assert found == {"api.missing", "api.exports"}


def test_unimportable_module_is_a_violation_not_a_pass(repo: Repo) -> None:
    repo.write(ALPHA_MOD, "def rotate(:\n")
    code, out = repo.gate_json()
    assert code == 1
    v = api_violations(out)[0]
    assert v["rule"] == "api.missing"
    assert v["path"] == ALPHA_MOD
    assert v["line"] == 1


def test_pr_gate_inspects_the_head_revision_not_the_working_tree(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "turns: int = 1,", "turns: int = 2,")
    repo.commit()
    # An uncommitted fix that keeps a docstring change, so the working tree differs from main.
    repo.replace(ALPHA_MOD, "turns: int = 2,", "turns: int = 1,")
    repo.replace(ALPHA_MOD, "    _check(x)\n", '    """Rotate."""\n    _check(x)\n')
    code, _ = repo.gate_json(*PR)
    assert code == 1
    code, out = repo.gate_json("--stage", "alpha", "--base", "main")  # working tree
    assert code == 0, out["violations"]


def test_assigned_signature_is_caught_from_the_source(repo: Repo) -> None:
    repo.replace(
        ALPHA_MOD,
        "def rotate(x: list[float], *, turns: int = 1, label: str | None = None) -> list[float]:",
        "def rotate(\n    x: list[float], *, turns: int = 1, label: str | None = None,"
        " cheat: bool = False\n) -> list[float]:",
    )
    repo.write(
        ALPHA_MOD,
        repo.read(ALPHA_MOD).replace("\n\n__all__", "\n\nimport inspect\n\n__all__")
        + "\n\ndef _spec(x: list[float], *, turns: int = 1, label: str | None = None)"
        + " -> list[float]: ...\n\n\nrotate.__signature__ = inspect.signature(_spec)\n",
    )
    code, out = repo.gate_json()
    assert code == 1
    (v,) = [v for v in api_violations(out) if v["rule"] == "api.source"]
    assert "cheat" in v["message"]
    assert v["path"] == ALPHA_MOD
    assert not [v for v in api_violations(out) if v["rule"] == "api.signature"]


def test_a_decorator_hiding_a_parameter_is_caught(repo: Repo) -> None:
    repo.write(
        ALPHA_MOD,
        repo.read(ALPHA_MOD)
        .replace("def rotate(", "def _real_rotate(")
        .replace(
            "label: str | None = None) -> list[float]:",
            "label: str | None = None, x2: int = 0) -> list[float]:",
        )
        .replace(
            "    def run(self, x: float, *, fast: bool = False) -> float:",
            "    def _run(self, x: float, *, fast: bool = False, extra: int = 0) -> float:",
        )
        + "\n\nimport functools\n\n\n"
        + "def _spec(x: list[float], *, turns: int = 1, label: str | None = None)"
        + " -> list[float]: ...\n\n\nrotate = functools.wraps(_spec)(_real_rotate)\n\n\n"
        + "def _run_spec(self, x: float, *, fast: bool = False) -> float: ...\n\n\n"
        + "Thing.run = functools.wraps(_run_spec)(Thing._run)\n",
    )
    code, out = repo.gate_json()
    assert code == 1
    found = api_violations(out)
    assert [v["rule"] for v in found] == ["api.source", "api.source"]
    assert "x2: int = 0" in found[0]["message"]
    assert "run: " in found[1]["message"]
    assert "extra: int = 0" in found[1]["message"]


def test_a_dataclass_init_is_read_from_its_fields(repo: Repo) -> None:
    repo.write(
        ALPHA_MOD,
        repo.read(ALPHA_MOD)
        .replace(
            "class Thing:\n    def __init__(self, size: int) -> None:\n        self.size = size\n",
            "@dataclasses.dataclass\nclass Thing:\n    size: int\n",
        )
        .replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport dataclasses\n",
        ),
    )
    code, out = repo.gate_json()
    assert code == 0, out["violations"]
    repo.write(ALPHA_MOD, repo.read(ALPHA_MOD) + "\nThing.__init__.__signature__ = None\n")
    code, out = repo.gate_json()
    assert code == 1


@pytest.mark.parametrize(
    "fields",
    [
        "    size: int\n    scale: float = dataclasses.field(default=1.0, kw_only=True)\n",
        "    size: int\n    _: dataclasses.KW_ONLY\n    scale: float = 1.0\n",
    ],
)
def test_a_dataclass_init_with_keyword_only_fields_is_read_as_generated(
    repo: Repo, fields: str
) -> None:
    repo.write(
        ALPHA_MOD,
        repo.read(ALPHA_MOD)
        .replace(
            "class Thing:\n    def __init__(self, size: int) -> None:\n        self.size = size\n",
            "@dataclasses.dataclass\nclass Thing:\n" + fields,
        )
        .replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport dataclasses\n",
        ),
    )
    wanted = '__init__ = "(self, size: int, *, scale: float = 1.0)"'
    repo.replace("specs/alpha.toml", '__init__ = "(self, size: int)"', wanted)
    code, out = repo.gate_json()
    assert code == 0, out["violations"]


OVERLOADED_RUN = """\
    @overload
    def run(self, x: float, *, fast: Literal[False] = False) -> float: ...
    @overload
    def run(self, x: float, *, fast: Literal[True]) -> int: ...

    def run(self, x: float, *, fast: bool = False) -> float:
"""


def _overload_run(repo: Repo, implementation: str) -> None:
    """Give ``Thing.run`` two ``typing.overload`` views above ``implementation``."""
    repo.replace(
        ALPHA_MOD,
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nfrom typing import Literal, overload\n",
    )
    repo.replace(
        ALPHA_MOD,
        "    def run(self, x: float, *, fast: bool = False) -> float:\n",
        OVERLOADED_RUN.replace(
            "    def run(self, x: float, *, fast: bool = False) -> float:\n", implementation
        ),
    )


def test_overloads_are_judged_by_the_implementation_that_runs(repo: Repo) -> None:
    """Overload stubs are for type checkers; the spec pins the ``def`` that runs.

    Their signatures differ from the spec on purpose (``Literal``, another
    return), so a check that read the first ``def run`` would fail here.
    """
    _overload_run(repo, "    def run(self, x: float, *, fast: bool = False) -> float:\n")
    code, out = repo.gate_json()
    assert code == 0, out["violations"]


def test_an_overloaded_implementation_that_drifts_is_caught_at_its_def(repo: Repo) -> None:
    _overload_run(repo, "    def run(self, x: float, *, fast: bool = True) -> float:\n")
    code, out = repo.gate_json()
    assert code == 1
    (v,) = api_violations(out)
    assert v["rule"] == "api.signature"
    assert "parameter 'fast': expected default False, found True" in str(v["message"])
    line = (
        repo.read(ALPHA_MOD)
        .splitlines()
        .index("    def run(self, x: float, *, fast: bool = True) -> float:")
    )
    assert v["line"] == line + 1


def test_an_overload_stub_left_as_the_running_method_fails_closed(repo: Repo) -> None:
    """A stub after the implementation replaces it: ``typing``'s dummy runs, no ``def`` here."""
    repo.replace(
        ALPHA_MOD,
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nfrom typing import overload\n",
    )
    repo.write(
        ALPHA_MOD,
        repo.read(ALPHA_MOD)
        + "\n    @overload\n    def run(self, x: float, *, fast: bool = False) -> float: ...\n",
    )
    code, out = repo.gate_json()
    assert code == 1
    found = {str(v["rule"]): str(v["message"]) for v in api_violations(out)}
    assert "is not defined in the tree under check" in found["api.source"]
    assert "expected parameters (self, x, fast), found (args, kwds)" in found["api.signature"]
