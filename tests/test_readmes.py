"""Every README example runs in the order written, from the install line above it.

``nox -s test-readmes`` builds a wheel of every package (``nox -s build``'s
``dist/``), puts their folder in ``NIELS_GPT_WHEELS`` and runs this file. For
each walk of each README (``readme_walk``): a fresh venv, torch seeded into it
(``readme_env``: only torch and its own requirements, never numpy or a
stage), the walk's install line, then its blocks in order in one working
folder. A missing stage in an install line is a ``ModuleNotFoundError``
there; a warning on stderr (torch's "Failed to initialize NumPy") fails too.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from readme_env import check_brings, link_seed, make_venv, pip_install, run_step
from readme_walk import RUN_MARKER, ReadmeError, Walk, parse_install, walks

ROOT = Path(__file__).resolve().parents[1]
READMES = [
    ROOT / "README.md",
    ROOT / "experiments" / "README.md",
    *sorted(ROOT.glob("packages/*/README.md")),
]


@pytest.fixture(scope="session")
def wheels() -> Path:
    folder = os.environ.get("NIELS_GPT_WHEELS")
    if not folder or not Path(folder).is_dir():
        pytest.fail(
            f"NIELS_GPT_WHEELS must name the folder of built wheels, got {folder!r}: "
            "run these through `nox -s test-readmes`"
        )
    return Path(folder)


@pytest.fixture(scope="session")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("seed")
    linked = link_seed(folder)
    assert any(d.startswith("torch==") for d in linked), linked
    assert not any(d.startswith(("numpy==", "niels-gpt")) for d in linked), linked
    return folder


@pytest.fixture(scope="session")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a block sees: a scratch HOME and corpus cache, one thread, no PYTHONPATH."""
    home = tmp_path_factory.mktemp("home")
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), NIELS_GPT_DATA=str(home / "data"), OMP_NUM_THREADS="1")
    return env


def walk_fresh(walk: Walk, tmp: Path, seed: Path, wheels: Path, env: dict[str, str]) -> None:
    """A new venv, the walk's install line, its blocks in order (all in ``tmp``)."""
    python = make_venv(tmp / "venv", seed)
    pip_install(python, walk.install, wheels=wheels, constraints=ROOT / "constraints.txt")
    stages = {p.name.split("-")[0].replace("_", "-") for p in wheels.glob("*.whl")}
    check_brings(python, walk.install, stages)
    work = tmp / "work"
    work.mkdir()
    for step in walk.steps:
        try:
            run_step(step, python, work, env)
        except AssertionError as err:
            raise AssertionError(f"{walk.readme}: {err}") from None


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_readme_runs_from_its_install_lines(
    readme: Path, tmp_path: Path, seed: Path, wheels: Path, base_env: dict[str, str]
) -> None:
    found = walks(readme, ROOT)
    assert found, f"{readme}: no install line, so nothing shows how to get what it describes"
    for i, walk in enumerate(found):
        walk_fresh(walk, tmp_path / f"walk{i}", seed, wheels, base_env)


def _readme(tmp_path: Path, install: str, example: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(f"# t\n\n```bash\n{install}\n```\n\n```python\n{example}\n```\n")
    return path


def test_a_stage_missing_from_the_install_line_fails(
    tmp_path: Path, seed: Path, wheels: Path, base_env: dict[str, str]
) -> None:
    readme = _readme(
        tmp_path,
        "pip install -c constraints.txt --find-links dist niels-gpt-core",
        "import niels_gpt.config\nimport niels_gpt.model.rope",
    )
    (walk,) = walks(readme, tmp_path)
    with pytest.raises(AssertionError, match=r"No module named 'niels_gpt.model"):
        walk_fresh(walk, tmp_path / "w", seed, wheels, base_env)


def test_an_install_line_that_brings_more_than_it_says_fails(
    tmp_path: Path, seed: Path, wheels: Path, base_env: dict[str, str]
) -> None:
    line = "pip install -c constraints.txt --find-links dist niels-gpt-attention   # brings core"
    (walk,) = walks(_readme(tmp_path, line, "print(1)"), tmp_path)
    assert walk.install.brings == ("core",)
    with pytest.raises(AssertionError, match=r"installed but not said: \['niels-gpt-rope'\]"):
        walk_fresh(walk, tmp_path / "w", seed, wheels, base_env)


def test_one_stage_alone_imports_torch_without_a_warning(
    tmp_path: Path, seed: Path, wheels: Path, base_env: dict[str, str]
) -> None:
    # rope is the stage with the fewest dependencies; torch warns at import
    # ("Failed to initialize NumPy") unless the stage brought numpy.
    readme = _readme(
        tmp_path,
        "pip install -c constraints.txt --find-links dist niels-gpt-rope",
        "import torch\nimport niels_gpt.model.rope\nprint(torch.ones(2).numpy())",
    )
    (walk,) = walks(readme, tmp_path)
    walk_fresh(walk, tmp_path / "w", seed, wheels, base_env)


# --- the parser alone (no environments) -----------------------------------------


def test_install_lines_are_read_as_a_user_types_them() -> None:
    words = shlex.split("python -m pip install -c constraints.txt -f dist niels-gpt-x[plot]")
    install = parse_install([*words, "--extra-index-url", "https://example.invalid/cpu"], "r:1")
    assert install is not None and install.requirements == ("niels-gpt-x[plot]",)
    assert install.constraints and install.find_links
    assert parse_install(shlex.split("python -m pip install -c constraints.txt nox"), "r:1") is None
    assert parse_install(shlex.split("nox -s build"), "r:1") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("pip install ./experiments[plot]", r"r:1: expected a distribution name, got './exp"),
        ("pip install -e niels-gpt-core", r"pip option '-e' is not one"),
        ("pip install -c other.txt niels-gpt-core", r"expected -c constraints.txt, got -c 'oth"),
        ("pip install --find-links wheels niels-gpt-core", r"expected --find-links dist, got"),
    ],
)
def test_install_lines_the_test_cannot_reproduce_are_refused(line: str, message: str) -> None:
    with pytest.raises(ReadmeError, match=message):
        parse_install(shlex.split(line), "r:1")


def test_walks_follow_the_install_line_above_them(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "```bash\npip install -f dist niels-gpt-a   # in a clone; brings b, c and d\n```\n"
        "```python\nprint(1)\n```\n"
        "```bash\nniels-train --out x   # read, not run\n```\n"
        f"{RUN_MARKER}\n```bash\nniels-train --quick\n```\n"
        "```python\nprint(2)\n```\n"
        "```sh\nnox -s build\npython -m pip install \\\n  --find-links dist niels-gpt-b\n```\n"
        "```python\nprint(3)\n```\n"
    )
    first, second = walks(readme, tmp_path)
    assert (first.line, first.install.requirements) == (1, ("niels-gpt-a",))
    assert [(s.syntax, s.code) for s in first.steps] == [
        ("python", "print(1)\n"),
        ("bash", "niels-train --quick\n"),
        ("python", "print(2)\n"),
    ]
    assert first.install.brings == ("b", "c", "d") and second.install.brings is None
    assert second.install.requirements == ("niels-gpt-b",)
    assert [s.code for s in second.steps] == ["print(3)\n"]


def test_an_example_with_no_install_line_above_it_is_refused(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n```python\nprint(1)\n```\n")
    with pytest.raises(ReadmeError, match=r"README.md:3: a Python example with no install line"):
        walks(readme, tmp_path)
