"""``device-branches``: a stage computes alike on every device.

A PR that adds a path taken on one device type only is refused; the
branches its base already has, and a line that only moves, stand.
"""

from __future__ import annotations

import pytest
from gatekit import Repo, rules

from niels_gpt_contracts.checks.code.device_branches import sites

PR = ("--stage", "beta", "--base", "main", "--head", "HEAD", "--no-api")
BETA = "packages/beta/src/ngx/beta_mod.py"
USE = "    return alpha_mod.rotate(x)\n"


@pytest.mark.parametrize(
    "branch",
    [
        "    if getattr(x, 'is_cuda', False):\n        return x\n",
        "    if x.device.type == 'cuda':\n        return x\n",
        "    if 'mps' == x.device.type:\n        return x\n",
        "    if x.device.type in ('cuda', 'mps'):\n        return x\n",
        "    if x.is_mps:\n        return x\n",
        "    import torch\n    if torch.cuda.is_available():\n        return x\n",
    ],
)
def test_a_new_branch_on_the_device_type_is_refused(repo: Repo, branch: str) -> None:
    repo.replace(BETA, USE, branch + USE)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1, out
    assert ("devices.branch", BETA) in rules(out)


def test_a_branch_the_base_has_stands_and_moving_it_is_no_new_one(repo: Repo) -> None:
    branch = "    if x.device.type == 'cuda':\n        pass\n"
    repo.replace(BETA, USE, branch + USE)
    repo.commit()
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--ff-only", "pr")
    repo.git("checkout", "-q", "pr")
    repo.replace(BETA, branch + USE, "    y = x\n" + branch + USE)
    repo.commit()
    _, out = repo.gate_json(*PR)
    assert ("devices.branch", BETA) not in rules(out)
    assert any(o["check"] == "device-branches" and o["status"] == "KEPT" for o in out["outcomes"])


def test_sites_are_found_in_the_source_text() -> None:
    text = (
        "def f(x, d):\n"
        "    a = x.is_cuda\n"
        "    b = d.type != 'cpu'\n"
        "    c = torch.backends.mps.is_available()\n"
        "    e = x.device == d\n"
        "    return x.dtype == 'float32'\n"
    )
    assert [s for _, s in sites(text)] == [
        "x.is_cuda",
        "d.type != 'cpu'",
        "torch.backends.mps.is_available()",
    ]


def test_a_branch_in_a_file_the_spec_lists_stands(repo: Repo) -> None:
    """``paths.device_branches``: the brief names where a device branch belongs."""
    repo.git("checkout", "-q", "main")
    repo.replace(
        "specs/beta.toml",
        'may_change = ["packages/beta/**"]\n',
        'may_change = ["packages/beta/**"]\ndevice_branches = ["packages/beta/src/ngx/*.py"]\n',
    )
    repo.commit("beta may branch on the device in its module")
    repo.git("checkout", "-q", "pr")
    repo.git("merge", "-q", "main")
    repo.replace(BETA, USE, "    if x.device.type == 'cpu':\n        return x\n" + USE)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert ("devices.branch", BETA) not in rules(out), out
    assert code == 0, out
