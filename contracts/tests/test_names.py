"""Source rules on names: a name is checked for what it is, and writes to what a
stage does not own are named (``source.name``, ``source.foreign-write``).

Library names are resolved in a fresh interpreter that imports no code of the
tree (this one's, which has torch); each test puts every case in one module
so that one gate run judges them all, and checks every line is named.
"""

from __future__ import annotations

from typing import Any

import pytest
from gatekit import Repo

BETA_MOD = "packages/beta/src/ngx/beta_mod.py"
PR = ("--stage", "beta", "--base", "main", "--head", "HEAD")

REFUSED_NAMES = [
    "from torch.serialization import os",
    "import torch.utils.collect_env",
    "from torch.utils.collect_env import run",
    "import torch\nshell = torch.utils.collect_env.run",
    "import torch\ninterp = torch.os",
    "from torch import sys",
    "import torch\ntorch.nn.modules.module.register_module_forward_hook(print)",
    "from torch.nn.modules.module import register_module_forward_pre_hook",
    "import torch\ntorch.manual_seed(0)",
    "import torch\ntorch.set_default_dtype(torch.float64)",
    "from torch.utils import data",
    "import torch.fx",
    "import torch.nn.utils.parametrize",
    "x = alpha_mod._check",
]
# Every way stage code can set or reseed a global random generator (torch's
# default CPU generator, or a device's): each must be named wherever it is reached from.
RESEEDS = [
    "import torch\n_S = torch.zeros(5056, dtype=torch.uint8)",  # a state, reached no global way
    "import torch\ntorch.default_generator.set_state(_S)",
    "import torch\n_g = torch.default_generator\n_g.manual_seed(1)",
    "from torch import default_generator",
    "import torch\ntorch.Generator.set_state(torch.default_generator, _S)",
    "import torch\ngetattr(torch, 'default_generator').set_state(_S)",
    "import torch\ngetattr(torch, 'manual_seed')(0)",
    "import torch\ntorch.seed()",
    "import torch\ntorch.set_rng_state(_S)",
    "import torch\ntorch.random.manual_seed(0)",
    "import torch\ntorch.random.fork_rng()",
    "import torch\ntorch.cuda.manual_seed_all(0)",
    "import torch\ntorch.cuda.seed_all()",
    "import torch\ntorch.cuda.set_rng_state_all([])",
    "import torch\ntorch.cuda.default_generators[0].set_state(_S)",
    "import torch\ntorch.mps.manual_seed(0)",
    "import torch\ntorch.mps.set_rng_state(_S)",
    "import random\nrandom.seed(0)",
    "import numpy\nnumpy.random.seed(0)",
]
# A generator the stage builds itself is its own to seed.
OWN_GENERATORS = [
    "import torch\n_own = torch.Generator()\n_own.manual_seed(3)",
    "import torch\n_state = torch.Generator().manual_seed(3).get_state()",
]
ALLOWED_NAMES = [
    "import torch\n_z = torch.zeros(2)",
    "import torch.nn.functional as F\n_s = F.softmax",
    "import torch\n_g = torch.Generator",
    "from torch import nn\n_lin = nn.Linear",
    "import torch\n_c = torch.compiler.is_compiling",
    "import math\n_p = math.pi",
    "def _twice(x):\n    return alpha_mod.rotate(alpha_mod.rotate(x))",
]
FOREIGN_WRITES = [
    "alpha_mod.rotate = len",
    "alpha_mod.Thing.run = len",
    'setattr(alpha_mod, "rotate", len)',
    'delattr(alpha_mod.Thing, "run")',
    "del alpha_mod.rotate",
    "import torch\ntorch.nn.Linear.forward = len",
    "import torch\ntorch.backends.cudnn.enabled = False",
    "Alias = alpha_mod.Thing\nAlias.run = len",
    "for cls in (alpha_mod.Thing,):\n    cls.run = len",
    "def patch(m):\n    type(m).run = len",
    "def patch(m):\n    m.__class__.run = len",
    "def patch(m):\n    m.forward = len",
    "alpha_mod.__all__ += ['x']",
    "_kinds = [alpha_mod.Thing]\n_kinds[0].run = len",
    "_cls = getattr(alpha_mod, 'Thing')\n_cls.run = len",
    "_table = {'t': alpha_mod.Thing}\n_table['t'].size = 3",
]


def _module(repo: Repo, cases: list[str]) -> list[tuple[int, int]]:
    """Append every case to beta's module; the line span of each."""
    text = repo.read(BETA_MOD)
    spans = []
    for case in cases:
        start = text.count("\n") + 1
        text += case + "\n"
        spans.append((start, start + case.count("\n")))
    repo.write(BETA_MOD, text)
    repo.commit()
    return spans


def _named(out: dict[str, Any], rule: str) -> set[int]:
    return {v["line"] for v in out["violations"] if v["rule"] == rule and v["path"] == BETA_MOD}


def test_names_are_refused_for_what_they_resolve_to(repo: Repo) -> None:
    spans = _module(repo, REFUSED_NAMES)
    code, out = repo.gate_json(*PR)
    assert code == 1
    named = _named(out, "source.name")
    missed = [
        c for c, (a, b) in zip(REFUSED_NAMES, spans, strict=True) if not named & {*range(a, b + 1)}
    ]
    assert missed == [], out["violations"]


def test_every_way_to_reseed_a_global_generator_is_refused(repo: Repo) -> None:
    spans = _module(repo, RESEEDS)
    code, out = repo.gate_json(*PR)
    assert code == 1
    named = _named(out, "source.name") | _named(out, "source.import")
    missed = [c for c, (a, b) in zip(RESEEDS, spans, strict=True) if not named & {*range(a, b + 1)}]
    assert missed[:1] == [RESEEDS[0]], out["violations"]  # the state itself is plain
    missed = missed[1:]
    assert missed == [], out["violations"]


def test_plain_library_names_and_stage_exports_pass(repo: Repo) -> None:
    _module(repo, ALLOWED_NAMES + OWN_GENERATORS)
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]


def test_writes_to_what_the_stage_does_not_own_are_named(repo: Repo) -> None:
    spans = _module(repo, FOREIGN_WRITES)
    code, out = repo.gate_json(*PR, "--no-api")
    assert code == 1
    named = _named(out, "source.foreign-write")
    missed = [
        c for c, (a, b) in zip(FOREIGN_WRITES, spans, strict=True) if not named & {*range(a, b + 1)}
    ]
    assert missed == [], out["violations"]


@pytest.mark.parametrize(
    "case",
    [
        "class Box:\n    def set(self, m, cache):\n        self.size = 1\n        m.cache = cache",
        "def fill(xs):\n    xs[0] = 1.0\n    return xs",
        "TABLE = {}\nTABLE['a'] = 1",
    ],
    ids=["instance-attributes", "an-argument's-item", "own-module-state"],
)
def test_writes_to_the_stages_own_objects_pass(repo: Repo, case: str) -> None:
    _module(repo, [case])
    code, out = repo.gate_json(*PR, "--no-api")
    assert code == 0, out["violations"]


@pytest.mark.parametrize(
    "case",
    [
        "x = __file__",
        "def up(e):\n    return e.__traceback__",
        "def up(g):\n    return g.gi_frame.f_back",
    ],
)
def test_where_the_code_runs_from_is_not_readable(repo: Repo, case: str) -> None:
    _module(repo, [case])
    code, out = repo.gate_json(*PR, "--no-api")
    assert code == 1
    assert _named(out, "source.dynamic"), out["violations"]


SWITCH = "def switch(m):\n    m.__class__ = alpha_mod.Thing\n"


@pytest.mark.parametrize("on", [True, False], ids=["rule-on", "rule-off"])
def test_an_in_place_class_switch_is_refused_where_the_spec_says_so(repo: Repo, on: bool) -> None:
    """A spec bans in-place class switches with a ``forbidden_name`` rule on ``__class__``
    (as fastpath, kv_cache and padding do): assignment and ``setattr`` are both named."""
    if on:
        repo.git("checkout", "-q", "main")
        spec = repo.read("specs/beta.toml")
        rule = (
            '\n[[rules]]\nid = "no-class-switch"\nkind = "forbidden_name"\n'
            'message = "beta switches no object\'s class"\nfiles = ["packages/beta/src/**/*.py"]\n'
            'names = ["__class__"]\n'
        )
        repo.write(
            "specs/beta.toml", spec.replace("\n[[invariants]]", rule + "\n[[invariants]]", 1)
        )
        repo.commit("maintainers: ban class switches in beta")
        repo.git("checkout", "-q", "pr")
        repo.git("merge", "-q", "main")
    spans = _module(repo, [SWITCH, "def also(m):\n    setattr(m, '__class__', alpha_mod.Thing)\n"])
    code, out = repo.gate_json(*PR, "--no-api")
    named = {v["line"] for v in out["violations"] if v["rule"] == "static.no-class-switch"}
    if on:
        assert code == 1
        assert {spans[0][0] + 1, spans[1][0] + 1} <= named, out["violations"]
    else:
        assert code == 0, out["violations"]
