"""A stage computes alike on every device: no new device-type branch (``device-branches``).

A PR that takes another code path on one device type ("a faster form on
CUDA") gives that device's users another model than the CPU's, and the
oracle, which runs on the CPU, never sees it. This check reads the stage's
modules on the base and on the PR (nothing runs) and refuses every branch
on the device type the base does not have:

- a device-kind flag: ``x.is_cuda``, ``x.is_mps``, ``x.is_xpu``, ``x.is_xla``,
  also read by name (``getattr(x, "is_cuda")``);
- a comparison of a ``.type`` with a device name (``x.device.type == "cuda"``,
  ``d.type in ("cuda", "mps")``);
- a device's ``is_available()`` (``torch.cuda.is_available()``).

The places the base has stand, and so do the files the spec lists in
``paths.device_branches`` (a spec amendment adds one, as quant's CPU kernel
did): a PR brings a new branch only where its brief says one belongs. Sites are compared as
source text with their counts, so moving a line is no new branch. A name
built at run time (``getattr(x, "is_" + kind)``) or a device read from a
string (``str(x.device)``) is beyond a reading of the text: SECURITY.md.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from typing import TypeGuard

from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import compile_patterns

CHECK = "device-branches"
FLAGS = frozenset({"is_cuda", "is_mps", "is_xpu", "is_xla"})
NAMES = frozenset({"cpu", "cuda", "mps", "xpu", "xla", "meta", "hip"})
BACKENDS = frozenset({"cuda", "mps", "xpu"})

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
DEVICES_BRANCH = Rule(
    "devices.branch",
    "A new branch on the device type in a stage's code.",
    "A stage must compute the same function on every device: a path taken on one "
    "device type only (is_cuda, device.type == ..., cuda.is_available()) gives those "
    "users another model, which the CPU oracle never sees. Only the branches the base "
    "already has stand.",
    "Compute alike on every device, or list the file in the spec's paths.device_branches "
    "by an amendment first.",
)


def _names(node: ast.expr) -> set[str]:
    return {
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES
    }


def _flag_by_name(node: ast.AST) -> TypeGuard[ast.Call]:
    """``getattr(x, "is_cuda", ...)``: a device-kind flag read by name."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in FLAGS
    )


def sites(source: str) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every branch on the device type in ``source``.

    Raises:
        SyntaxError: ``source`` is not Python (the source check reports it).
    """
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in FLAGS) or _flag_by_name(node):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            typed = any(isinstance(s, ast.Attribute) and s.attr == "type" for s in sides)
            if typed and any(_names(s) for s in sides):
                yield node.lineno, ast.unparse(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "is_available"
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr in BACKENDS
        ):
            yield node.lineno, ast.unparse(node)


def _count(text: str | None) -> Counter[str]:
    if text is None:
        return Counter()
    try:
        return Counter(s for _, s in sites(text))
    except SyntaxError:
        return Counter()


def check(ctx: pr_context.PrContext) -> list[Violation]:
    """Every device branch in the PR's stage modules beyond the base's (same text, same
    count), outside the files the spec's ``paths.device_branches`` lists."""
    spec = ctx.spec
    listed = compile_patterns(list(spec.device_branches))
    base = Counter[str]()
    for path in spec.module_files:
        base += _count(ctx.base_tree.read(path))
    found = []
    for path in spec.module_files:
        if listed.match_file(path):
            continue
        text = ctx.head_tree.read(path)
        if text is None:
            continue
        try:
            located = list(sites(text))
        except SyntaxError:
            continue
        for line, site in located:
            if base[site] > 0:
                base[site] -= 1
                continue
            why = (
                f"a new branch on the device type: {site[:120]!r} (the stage must compute "
                "alike on every device; the base has no such branch)"
            )
            found.append(
                Violation(DEVICES_BRANCH.id, path, line, why, spec.id, CHECK, changed=True)
            )
    return found
