"""Proof keys: the normal form keeps what Python runs and drops what it cannot see."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from niels_gpt_contracts.mutants.proof import ProofKeys, normal_form, reads_itself

CODE = '''\
"""A module."""

import math


def area(r):
    """Of a circle."""
    return math.pi * r**2  # exact


class Box:
    """Holds one thing."""

    def __init__(self, x):
        self.x = x
'''

words = st.text(alphabet=st.characters(codec="ascii", categories=["L", "N", "Zs"]), max_size=30)


@given(doc=words, comment=words, blank=st.integers(0, 3))
def test_docstrings_comments_and_layout_do_not_count(doc: str, comment: str, blank: int) -> None:
    edited = CODE.replace("A module.", doc.replace('"', "")).replace("# exact", f"# {comment}")
    edited = edited.replace("\n\n\nclass", "\n" * (3 + blank) + "class")
    assert normal_form(edited) == normal_form(CODE)


def test_a_docstring_only_body_is_an_empty_body() -> None:
    assert normal_form('def f():\n    """Nothing."""\n') == normal_form("def f():\n    pass\n")


def test_code_counts() -> None:
    for old, new in [("r**2", "r**3"), ("self.x = x", "self.x = -x"), ("math.pi", "3.14")]:
        assert normal_form(CODE.replace(old, new)) != normal_form(CODE), new


def test_a_coding_line_counts_and_text_that_does_not_parse_is_taken_exactly() -> None:
    assert normal_form("# -*- coding: latin-1 -*-\n" + CODE) != normal_form(CODE)
    assert normal_form("def f(:\n") != normal_form("def f(:  \n")


def test_readers_of_source_are_found_in_code_not_in_prose() -> None:
    assert not reads_itself([CODE, '"""Inspect the __doc__ of each line."""\n# inspect\n'])
    for code in (
        "import inspect\n",
        "from linecache import getline\n",
        "def f():\n    return f.__doc__\n",
        "x = getattr(object, '__doc__')\n",
        "import sys\nline = sys._getframe().f_lineno\n",
        "def f(:\n",
    ):
        assert reads_itself([CODE, code]), code


def test_a_reader_in_tests_a_mutant_never_runs_leaves_its_key_in_normal_form() -> None:
    """A docstring edit keeps a mutant's proof unless the code or the tests its runs can
    import read text: a later stage's test that loads a file by ``__file__`` does not."""
    reader = "from pathlib import Path\nHERE = Path(__file__)\n"
    tests = {"a/tests/test_a.py": "def test_a():\n    pass\n", "b/tests/test_b.py": reader}

    def key(code_text: str, ran: str) -> str:
        keys = ProofKeys({"a/src/m.py": code_text}, tests, ["conftest"], "env")
        return keys.key("a.m", "a/src/m.py", code_text.replace("r**2", "r**3"), [ran])

    documented = CODE.replace("A module.", "A module, documented again.")
    assert documented != CODE
    assert key(documented, "a/tests/test_a.py") == key(CODE, "a/tests/test_a.py")
    assert key(documented, "b/tests/test_b.py") != key(CODE, "b/tests/test_b.py")
    reading_code = CODE + "\nimport inspect\n"
    assert key(reading_code.replace("A module.", "B."), "a/tests/test_a.py") != key(
        reading_code, "a/tests/test_a.py"
    )
