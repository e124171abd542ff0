"""Every stage spec of a tree, validated and put in dependency order."""

from __future__ import annotations

from collections.abc import Mapping

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.stagespec import (
    SCHEMA_PATH,
    SPECS_DIR,
    Spec,
    load_schema,
    parse_specs,
    spec_path,
)


def load_specs(tree: Tree) -> dict[str, Spec]:
    """Every ``specs/*.toml`` of ``tree``, validated, in dependency order."""
    names = [
        f
        for f in tree.files()
        if f.startswith(f"{SPECS_DIR}/") and f.endswith(".toml") and f.count("/") == 1
    ]
    if not names:
        raise ConfigError(
            f"expected stage specs {SPECS_DIR}/*.toml in the {tree.label}, found none"
        )
    texts = tree.read_many([*names, SCHEMA_PATH])
    schema = load_schema(texts.pop(SCHEMA_PATH))
    unreadable = sorted(p for p, t in texts.items() if t is None)
    if unreadable:
        raise ConfigError(
            f"{unreadable[0]}: expected a readable TOML text file, found "
            "something else (symlink or binary)"
        )
    specs = parse_specs({p: t for p, t in texts.items() if t is not None}, schema)
    ordered: list[str] = []

    def visit(stage: str, trail: tuple[str, ...]) -> None:
        if stage in ordered:
            return
        if stage in trail:
            raise ConfigError(
                f"{spec_path(stage)}: depends_on forms a cycle: {' -> '.join((*trail, stage))}"
            )
        for dep in specs[stage].depends_on:
            visit(dep, (*trail, stage))
        ordered.append(stage)

    for stage in sorted(specs):
        visit(stage, ())
    return {s: specs[s] for s in ordered}


def pick(specs: Mapping[str, Spec], stage: str, where: str) -> Spec:
    if stage not in specs:
        raise ConfigError(
            f"unknown stage {stage!r}: expected one of {', '.join(specs)} "
            f"(specs in {where}), found no {spec_path(stage)}"
        )
    return specs[stage]
