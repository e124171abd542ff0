"""A BROKEN oracle row explains itself: words, blame and the reproducer (no verdict run).

``verdict.explain`` turns the Judge's findings into words and folds the rows
of dependant stages; ``verdict.repro`` writes a reproducer from a capture
(``sandbox/_oracle_capture.py``). Here each is fed by hand: answers built as
the worker would send them, a capture of a real attention module read back
through the real frame reader, the written script run in a plain process.
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox import _oracle_capture, _oracle_kit
from niels_gpt_contracts.sandbox.oracle_run import Call, Output, Stream, read_stream
from niels_gpt_contracts.verdict import explain, repro


def _call(name: str, desc: str, out: np.ndarray[Any, Any], error: str | None = None) -> Call:
    return Call(
        stage="attention", name=name, desc=desc, stages=4, reduction=4, rules=(),
        relations=(), compare=None, computes_in=None, error=error, message="",
        values={}, casts=(), outputs={"out": Output("float64", out)},
    )  # fmt: skip


def _row(stage: str, rule: str = "oracle.differs") -> Violation:
    return Violation(rule, f"packages/{stage}/x.py", None, f"{stage}: numbers", "attention", "o")


DEPENDS = {"attention": {"core", "rope"}, "block": {"attention", "core", "rope"}, "gpt": {"block"}}


def test_dependant_rows_fold_into_one_line_each() -> None:
    """3 attention rows stay; block's 3 and gpt's 2 become one ``oracle.follows`` line each."""
    owners = ["attention"] * 3 + ["block"] * 3 + ["gpt"] * 2
    found = [_row(s) for s in owners]
    found[4] = _row("block", "runtime.no-sdpa")  # says something of its own: kept whole
    out = explain.summarise(found, owners, "attention", {**DEPENDS, "gpt": {"block", "attention"}})
    assert out[:3] == found[:3]
    follows = [v for v in out if v.rule == explain.FOLLOWS]
    assert [v.message.split(":")[0] for v in follows] == ["block", "gpt"]
    assert all("follows from attention" in v.message and v.path is None for v in follows)
    assert "block: follows from attention: 2 differing call(s) there too" in follows[0].message
    assert found[4] in out
    assert len(out) == 3 + 1 + 1 + 1


def test_dependant_rows_stay_whole_when_the_changed_stage_is_clean() -> None:
    """Nothing to blame: a dependant failing on its own keeps every row."""
    owners = ["block", "block"]
    found = [_row("block"), _row("block")]
    assert explain.summarise(found, owners, "attention", DEPENDS) == found
    with pytest.raises(ValueError, match="owners"):
        explain.summarise(found, owners[:1], "attention", DEPENDS)


def test_a_stage_that_does_not_depend_on_the_changed_one_is_not_folded() -> None:
    owners = ["attention", "rope"]
    found = [_row("attention"), _row("rope")]
    assert explain.summarise(found, owners, "attention", DEPENDS) == found


def test_depends_is_transitive() -> None:
    class S:
        def __init__(self, *deps: str) -> None:
            self.depends_on = deps

    specs: Any = {"core": S(), "attention": S("core"), "block": S("attention"), "gpt": S("block")}
    assert explain.depends(specs)["gpt"] == {"block", "attention", "core"}


def test_depends_follows_imports_as_the_closure_does() -> None:
    """kv_cache imports the fast path without depending on it: a fastpath PR's kv_cache
    rows fold under fastpath, as the closure brought kv_cache in through that import."""

    class S:
        def __init__(self, *deps: str) -> None:
            self.depends_on = deps

    specs: Any = {"attention": S(), "fastpath": S("attention"), "kv_cache": S("attention")}
    assert "fastpath" not in explain.depends(specs)["kv_cache"]
    assert explain.depends(specs, {"kv_cache": {"fastpath"}})["kv_cache"] == {
        "attention",
        "fastpath",
    }


def test_relation_words_come_from_says_else_the_kind() -> None:
    says = _oracle_kit.Oracle.equal(("a", "out", ()), ("b", "out", ()), says="causality: x")
    assert explain.relation(says) == "causality: x"
    assert explain.relation(_oracle_kit.Oracle.upper_zero(("a", "1", ()))).startswith("causal")
    assert explain.relation({"kind": "equal"}) == explain.RELATION_WORDS["equal"]


def test_differs_words_name_the_kind_and_the_axis() -> None:
    w = _call("sweep/T=2", "B=1 T=2 C=4", np.ones(3))
    zeros = replace(w, outputs={"out": Output("float64", np.zeros(3))})
    assert explain.differs(w.name, w.desc, zeros, w, exact=False) == (
        "output differs from the base's at T=2, B=1"
    )
    nan = replace(w, outputs={"out": Output("float64", np.array([1.0, np.nan, 1.0]))})
    scaled = replace(w, desc="input scale 30 f32")
    assert explain.differs("big", scaled.desc, nan, scaled, exact=True) == (
        "NaN at input scale 30 where the float64 reference's answer is finite"
    )
    raised = replace(w, error="ValueError")
    assert explain.differs("bad", "", raised, replace(w, error="TypeError"), exact=False) == (
        "raised ValueError where the base raised TypeError"
    )
    eval_ = "B=3 T=128 C=8 cfg.T=1024 f64 eval no_grad"
    assert explain.differs("c/eval", eval_, w, w, exact=False) == (
        "output differs from the base's at T=128, B=3"
    )
    assert explain.differs("c", "cfg.T=1024 trace", w, w, exact=False) == (
        "traced activations differ from the base's"
    )
    assert explain.differs("c/grad2", "", w, w, exact=False).startswith("second derivative")
    assert explain.differs("c/backward", "", w, w, exact=False).startswith("gradient")


def test_smallest_prefers_the_fewest_tokens_then_the_smallest_batch() -> None:
    failed = [
        explain.Failed("attention", "a", "B=1 T=300 f32", False),
        explain.Failed("attention", "b", "B=4 T=2 f64", False),
        explain.Failed("attention", "c", "B=1 T=2 f64", False),
        explain.Failed("block", "d", "B=1 T=1 f64", False),
        explain.Failed("attention", "e", "bad input", False),
    ]
    assert [f.name for f in explain.smallest(failed, "attention")] == ["c", "b", "a"]


def _captured(fn: Any, name: str) -> Stream:
    """``fn``'s capture frame and answer, as a capture run's worker sends them."""
    pipe = io.BytesIO()
    frames = _oracle_kit.Frames(pipe)
    o = _oracle_kit.Oracle("attention", 1, frames, run=lambda _: True, watch={})
    o.capture = _oracle_capture.capture
    with torch.no_grad():
        o.call(name, fn, desc="B=1 T=5 C=8 f64 eval", stages=4, reduction=8)
    frames.write({"kind": "done"})
    stream = Stream("capture")
    assert read_stream(io.BytesIO(pipe.getvalue()), stream)
    return stream


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_reproducer_rebuilds_the_call_and_judges_it_by_the_bound(tmp_path: Path) -> None:
    """Own answer expected: exit 0; an expected answer off by 1e-3: exit 1 with the figure."""
    from niels_gpt.config import ModelConfig
    from niels_gpt.model.attention import CausalSelfAttention

    attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).double().eval()
    x = torch.randn(1, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    stream = _captured(partial(attn, x), "sweep/f64/T=5")
    answer = stream.calls[("attention", "sweep/f64/T=5")]
    # the stage modules' import names, as the oracle gives them: packages and named modules
    modules = {"niels_gpt.model.attention", "niels_gpt.model.attention.causal"}
    modules |= {"niels_gpt.config", "niels_gpt.config.model_config"}
    pick = [explain.Failed("attention", "sweep/f64/T=5", answer.desc, False)]
    script = repro.write(tmp_path / "ok", "attention", pick, stream, {False: stream}, modules)
    assert "niels_gpt_contracts" not in script.read_text()
    done = _run(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "within the bound" in done.stdout
    off = replace(answer, outputs={"out": Output("float64", answer.outputs["out"].data + 1e-3)})
    wants = Stream("base", calls={("attention", answer.name): off})
    bad = repro.write(tmp_path / "bad", "attention", pick, stream, {False: wants}, modules)
    done = _run(bad)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "max |diff| 0.001" in done.stdout


def test_a_capture_naming_no_stage_module_is_refused(tmp_path: Path) -> None:
    """Import paths from the worker must name a stage's module: anything else is refused."""
    from niels_gpt.config import ModelConfig
    from niels_gpt.model.attention import CausalSelfAttention

    attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).eval()
    stream = _captured(partial(attn, torch.zeros(1, 2, 8)), "c")
    pick = [explain.Failed("attention", "c", "", False)]
    with pytest.raises(repro.Refused, match="no stage's module"):
        repro.write(tmp_path, "attention", pick, stream, {False: stream}, {"niels_gpt.config"})
    lam = _captured(lambda: attn(torch.zeros(1, 2, 8)), "l")
    pick = [explain.Failed("attention", "l", "", False)]
    with pytest.raises(repro.Refused, match="Uncapturable"):
        repro.write(tmp_path, "attention", pick, lam, {False: lam}, {"niels_gpt.config"})


def test_a_call_on_a_meta_tensor_is_uncapturable_and_the_driver_goes_on() -> None:
    """A bad call on a ``meta`` tensor (no data to send) is refused, not the driver's end."""
    from niels_gpt.config import ModelConfig
    from niels_gpt.model.attention import CausalSelfAttention

    attn = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0)).eval()
    stream = _captured(partial(attn, torch.zeros(1, 2, 8, device="meta")), "m")
    recipe = stream.calls[("attention", "m#capture")]
    assert recipe.error == "Uncapturable"
    assert "arg.0 is a meta tensor" in recipe.message
    assert ("attention", "m") in stream.calls
