"""The files Python and pytest run without anyone importing them.

A ``conftest.py`` next to the tests, a ``sitecustomize.py`` or
``usercustomize.py`` or ``*.pth`` file on the path, an ini or ``setup.*`` file
that adds options or plugins: each runs code nobody asked for. Two layers
need the same list: ``checks.ownership.autoload`` forbids a stage PR to change one
(``path.autoload``), and ``sandbox.workspace`` never writes one out for a
sandboxed run. It lives here, below both, and imports nothing.
"""

from __future__ import annotations

SELF_LOADING_NAMES = frozenset(
    {
        "conftest.py",
        "sitecustomize.py",
        "usercustomize.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "setup.py",
    }
)
SELF_LOADING_SUFFIXES = (".pth",)


def file_name(path: str) -> str:
    """The last part of a ``/``-separated path, lower-cased: Conftest.py is
    conftest.py on macOS and Windows."""
    return path.rsplit("/", 1)[-1].lower()


def self_loading(path: str) -> bool:
    """Whether Python or pytest would run the file at ``path`` on its own."""
    name = file_name(path)
    return name in SELF_LOADING_NAMES or name.endswith(SELF_LOADING_SUFFIXES)
