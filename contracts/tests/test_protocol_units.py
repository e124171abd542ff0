"""The module protocol: the worker's measurements and the rules that judge them.

Each promise is shown the way a PR breaks it: a small module class that
keeps every promise is the base, and a variant that breaks exactly one is
the PR (built with the base's weights, as the verdict's PR worker is). The
variant's rule must fire, and the honest module against itself must keep
every rule. The whole phase through ``contracts pr`` on the real stages is
``test_pr_real_protocol.py`` (scenario).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save
from torch import nn

from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.sandbox import oracle_run, protocol_run
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.protocol_run import Answer
from niels_gpt_contracts.verdict import protocol, protocol_rules

SANDBOX = Path(protocol_run.__file__).parent
ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SANDBOX / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


STATE, PROBES = _load("_protocol_state"), _load("_protocol_probes")


class Config:
    """A config like the project's ``ModelConfig``: the fields the probe sizes name."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class Good(nn.Module):
    """Keeps every promise: two linears, called as submodules."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.C, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)))  # (B, T, C)


class Unpicklable(Good):
    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.act = lambda t: torch.relu(t)  # a local object: pickle and spawn fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))  # (B, T, C)


class HoldsCopy(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            self.cached = self.fc.weight.detach().clone()  # (d_ff, C) kept after the call
        return super().forward(x)


class SkipsHooks(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.fc.weight, self.fc.bias)  # (B, T, d_ff) without calling fc
        return self.out(torch.relu(h))  # (B, T, C)


class Reseeds(Good):
    def __init__(self, cfg: Config) -> None:
        torch.manual_seed(0)  # "reproducible builds"
        super().__init__(cfg)


class TiesBlocks(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.a = nn.Linear(cfg.C, cfg.C)
        self.b = nn.Linear(cfg.C, cfg.C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # (B, T, C)


class TiedBlocks(TiesBlocks):
    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight)  # every block starts as the first


class LeavesStance(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.compiler.set_stance("force_eager")  # and never set back
        return super().forward(x)


class ReadsValue(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.abs().amax()) > 1e30:  # a host read: a graph break under torch.compile
            raise ValueError("x too large")
        return super().forward(x)


class Renamed(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.C, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc1(x)))  # (B, T, C)


class Drifts(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.001  # (B, T, C) 0.1% off


SIZE = {"V": 20, "T": 16, "C": 16, "L": 2, "H": 2, "d_ff": 24, "dropout": 0.0, "rope_theta": 1e4}


def _probe(cls: type[nn.Module], given: dict[str, torch.Tensor] | None) -> Any:
    size = PROBES.Size("small", SIZE, 2, 5, 24)
    full = given is None  # as the verdict runs it: a loading run answers outputs alone
    p = PROBES.Probe(
        "m:X", cls, size, Config, 11, STATE.snapshot, STATE.changed, given=given, full=full
    )
    p.run()
    return p


def _outputs(found: dict[str, torch.Tensor]) -> dict[str, oracle_run.Output]:
    out = {}
    for key, t in found.items():
        out[key] = oracle_run.Output(str(t.dtype).removeprefix("torch."), t.numpy())
    return out


def _answer(probe: Any) -> Answer:
    report = {"classes": {"m:X": {"small": probe.report}}, "fatal": None}
    return Answer("head", report=report, outputs=_outputs(probe.outputs))


@functools.cache
def _base(cls: type[nn.Module]) -> Any:
    return _probe(cls, None)


def _verdict(base_cls: type[nn.Module], head_cls: type[nn.Module]) -> list[tuple[str, str]]:
    """The rules over a base class and a PR class, run as the verdict runs them: the
    PR's own measurements and a second run over the base's weights, merged."""
    base = _base(base_cls)
    head = protocol.merge(_answer(_probe(head_cls, None)), _answer(_probe(head_cls, base.weights)))
    got = head.probe("m:X", "small")
    assert got is not None
    pair = protocol_rules.Pair(
        "m:X", "small", "C=16", got, base.report,
        head.outputs, _outputs(base.outputs), stages=8, reduction=24,
    )  # fmt: skip
    return list(protocol_rules.judge(pair))


@pytest.fixture(autouse=True)
def _restore_stance() -> Any:
    yield
    torch.compiler.set_stance("default")


def test_a_module_against_itself_keeps_every_promise() -> None:
    assert _verdict(Good, Good) == []
    assert _verdict(TiesBlocks, TiesBlocks) == []


@pytest.mark.parametrize(
    ("variant", "rule", "words"),
    [
        (Unpicklable, "protocol.round-trip", "pickle of the module raised"),
        (HoldsCopy, "protocol.memory", "bytes of tensors after 1 call"),
        (SkipsHooks, "protocol.hooks", "fc: forward pre-hooks and hooks fired [0, 0] times"),
        (Reseeds, "protocol.init", "the same under two seeds"),
        (LeavesStance, "protocol.process-state", "torch.compiler.stance"),
        (ReadsValue, "protocol.compile", "graph(s) with 1 break(s)"),
        (Renamed, "protocol.state-dict", "state_dict lacks ['fc.bias', 'fc.weight']"),
        (Drifts, "protocol.load", "with the base's weights"),
    ],
)
def test_each_broken_promise_is_its_rule(variant: type[nn.Module], rule: str, words: str) -> None:
    found = _verdict(Good, variant)
    assert rule in {r for r, _ in found}, found
    assert any(words in m for r, m in found if r == rule), found


def test_a_checkpoint_that_does_not_load_is_one_finding_not_two() -> None:
    """At the real size only the loading run measures, and it stops at the failed load:
    no forward ran, and that is the load row's to say, not a 'raised' row too."""
    base = _base(Good)
    loaded = _answer(_probe(Renamed, base.weights))
    got = loaded.probe("m:X", "small")
    assert got is not None
    pair = protocol_rules.Pair(
        "m:X", "small", "C=16", got, base.report, loaded.outputs, _outputs(base.outputs),
        stages=8, reduction=24,
    )  # fmt: skip
    found = list(protocol_rules.judge(pair))
    assert "protocol.build" not in {r for r, _ in found}, found
    assert any(r == "protocol.load" and "does not load strictly" in m for r, m in found)


def test_blocks_that_start_equal_are_found() -> None:
    found = _verdict(TiesBlocks, TiedBlocks)
    words = "a.weight and b.weight start equal, where the base's start different"
    assert ("protocol.init", words) in found


def test_the_process_state_covers_torch_globals_without_a_list() -> None:
    """A flag no rule names (a backend's, a config's) is in the snapshot and seen to move."""
    before = STATE.snapshot()
    torch.backends.mkldnn.enabled = False
    torch._dynamo.config.suppress_errors = not torch._dynamo.config.suppress_errors
    try:
        moved = STATE.changed(before, STATE.snapshot())
    finally:
        torch.backends.mkldnn.enabled = True
        torch._dynamo.config.suppress_errors = not torch._dynamo.config.suppress_errors
    assert moved == ["torch._dynamo.config.suppress_errors", "torch.backends.mkldnn.enabled"]
    assert STATE.changed(before, STATE.snapshot()) == []


def test_the_sizes_are_drawn_from_the_seed_and_build_the_real_config() -> None:
    from niels_gpt.config import ModelConfig

    assert protocol.sizes(5) == protocol.sizes(5)
    assert protocol.sizes(5) != protocol.sizes(6)
    for seed in range(40):
        small, real = protocol.sizes(seed)
        ModelConfig(**small["cfg"])
        ModelConfig(**real["cfg"])
        assert 1 <= small["T"] <= small["cfg"]["T"] and 2 <= real["T"] <= 1024
        assert real["cfg"]["C"] == 768 and real["rows"] in (2304, 3072)


def test_the_classes_come_from_the_specs_api() -> None:
    specs = load_specs(WorkingTree(GitRepo(ROOT)))
    found = protocol.module_classes(list(specs.values()))
    assert "niels_gpt.model.gpt:GPT" in found
    assert "niels_gpt.model.quant:Int8Linear" in found
    assert "niels_gpt.model.attention:CausalSelfAttention" in found
    assert protocol.config_class(list(specs.values())) == "niels_gpt.config:ModelConfig"


def _wire(report: bytes, blob: bytes = b"") -> bytes:
    return struct.pack(">Q", len(report)) + report + struct.pack(">Q", len(blob)) + blob


GOOD = {"classes": {}, "defined": {}, "dtypes": {}, "skipped": {}, "fatal": None}


def test_a_workers_code_lies_in_a_user_like_home_removed_even_when_the_launch_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol worker's copy of the code is the oracle's kind (``user_like_home``:
    no checker in a module's ``__file__``), not a folder of the verdict's scratch, and
    it is removed though the worker could not start."""
    box = Sandbox.prepare(sys.executable, tmp_path / "scratch" / "sandbox", ["niels_gpt"], 1)
    home = tmp_path / "user-home"
    home.mkdir()
    monkeypatch.setattr(oracle_run, "user_like_home", lambda: home)
    seen: list[Any] = []

    def launch(_box: Sandbox, _worker: str, request: dict[str, Any], *_rest: Any) -> Any:
        seen.append(request["roots"])
        raise OSError("no interpreter")

    monkeypatch.setattr(oracle_run, "launch", launch)
    with pytest.raises(OSError, match="no interpreter"):
        protocol_run.run(box, "head", [], {}, tmp_path / "out", 1.0)
    assert seen == [[str(home / "lib" / "python3" / "site-packages")]]
    assert not home.exists()


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (_wire(b"not json"), "unreadable report"),
        (_wire(json.dumps({"classes": {}}).encode()), "unreadable report"),
        (
            _wire(
                json.dumps(
                    {**GOOD, "classes": {"a": {"small": {"build": None, "memory": {"1": -5}}}}}
                ).encode()
            ),
            "unreadable report",
        ),
        (_wire(json.dumps(GOOD).encode())[:-3], "unreadable report"),
        (_wire(json.dumps(GOOD).encode(), b"not safetensors"), "outputs safetensors cannot"),
        (
            _wire(json.dumps({**GOOD, "dtypes": {"k": "float32"}}).encode(), save({})),
            "the outputs do not match",
        ),
    ],
)
def test_a_malformed_answer_is_a_problem(raw: bytes, problem: str) -> None:
    answer = Answer("head")
    protocol_run._decode(raw, answer)
    assert answer.problem is not None and answer.problem.startswith(problem), answer.problem


def test_a_well_formed_answer_is_read() -> None:
    answer = Answer("head")
    blob = save({"k": torch.ones(2, 3)})
    protocol_run._decode(
        _wire(json.dumps({**GOOD, "dtypes": {"k": "float32"}}).encode(), blob), answer
    )
    assert answer.problem is None and answer.outputs["k"].data.shape == (2, 3)


class Gross(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.3  # (B, T, C) 30% off


def test_a_declared_break_loosens_the_outputs_to_bfloat16s_bound_only() -> None:
    """Under a pending ``Spec-Break`` the new numbers are the oracle's to judge: a
    rounding-sized change passes the load row, a gross error does not."""
    base = _base(Good)

    def load_rows(cls: type[nn.Module]) -> list[str]:
        head = protocol.merge(_answer(_probe(cls, None)), _answer(_probe(cls, base.weights)))
        got = head.probe("m:X", "small")
        assert got is not None
        pair = protocol_rules.Pair(
            "m:X", "small", "C=16", got, base.report, head.outputs, _outputs(base.outputs),
            stages=8, reduction=24, declared_break=True,
        )  # fmt: skip
        return [m for r, m in protocol_rules.judge(pair) if r == "protocol.load"]

    assert load_rows(Drifts) == []
    assert load_rows(Gross) != []


def test_declared_breaks_are_read_from_the_trailers_since_the_code_met_them(
    tmp_path: Path,
) -> None:
    """A break counts when it changed the stage's float64 reference and no ``Stage:``
    commit of that stage came after it; a break that left the reference alone (a kit
    split, a removed definition) changes no number."""
    from types import SimpleNamespace

    from gatekit import Repo

    repo = Repo(tmp_path)
    repo.git("init", "-q", "-b", "main")
    repo.git("config", "user.name", "m")
    repo.git("config", "user.email", "m@example.com")
    refs = {s: f"specs/{s}/{s}_reference.py" for s in ("q", "r")}
    specs: Any = {
        s: SimpleNamespace(oracle=SimpleNamespace(references={f"m.{s}": path}))
        for s, path in refs.items()
    }

    def commit(message: str, path: str = "f.txt") -> str:
        repo.write(path, message)
        return repo.commit(message)

    commit("start")
    commit("specs: q 2.0\n\nSpec: q\nSpec-Break: other numbers", refs["q"])
    commit("specs: r 1.1\n\nSpec: r", refs["r"])
    git = GitRepo(tmp_path)
    assert protocol.declared_breaks(git, "HEAD", specs) == {"q"}
    commit("q: the code of 2.0\n\nStage: q")
    assert protocol.declared_breaks(git, "HEAD", specs) == set()
    commit("specs: r 2.0, a kit split\n\nSpec: r\nSpec-Break: a definition moved")
    assert protocol.declared_breaks(git, "HEAD", specs) == set()
    repo.write(refs["q"], "q 3.0")
    commit("specs: q 3.0, r 3.0\n\nSpec: q\nSpec: r\nSpec-Break: both", refs["r"])
    assert protocol.declared_breaks(git, "HEAD", specs) == {"q", "r"}


class TinyLM(nn.Module):
    """A language model small enough to decode in a test: an embedding and a head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.emb = nn.Embedding(cfg.V, cfg.C)
        self.head = nn.Linear(cfg.C, cfg.V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))  # (B, T, V)


def _decoder(*, dynamic: bool | None = None, eager: bool = False, skew: float = 0.0) -> Any:
    """A greedy decoder whose single-token steps go through ``torch.compile(fullgraph=True)``
    with the backend ``compile_step`` names; the variants break one promise each."""

    def step(model: nn.Module, last: torch.Tensor, pos: int) -> torch.Tensor:
        return model(last)[:, -1] + 0 * pos  # (B, V); pos a Python int, specialised on or not

    def decode(
        model: nn.Module,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        compile_step: bool | str = False,
    ) -> torch.Tensor:
        fn: Any = step
        if compile_step and not eager:
            compiled = torch.compile(step, fullgraph=True, backend=compile_step, dynamic=dynamic)

            def fn(model: nn.Module, last: torch.Tensor, pos: int) -> torch.Tensor:
                out = compiled(model, last, pos)  # (B, V)
                return out + skew * torch.arange(out.shape[-1])  # (B, V), the last id favoured

        ids = prompt_ids  # (B, t)
        for i in range(max_new_tokens):
            logits = model(ids)[:, -1] if i == 0 else fn(model, ids[:, -1:], ids.shape[1])
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)  # (B, t + i + 1)
        return ids

    return decode


def _decode_verdict(head: Any) -> list[tuple[str, str]]:
    size = PROBES.Size("small", {"V": 11, "C": 8, "T": 12}, 2, 5, 8)

    def run(fn: Any) -> tuple[dict[str, Any], dict[str, oracle_run.Output]]:
        report, outputs = PROBES.decode_probe(
            fn, TinyLM, size, Config, 7, STATE.snapshot, STATE.changed
        )
        return report, _outputs({f"m:X|small|{k}": v for k, v in outputs.items()})

    (want, base_out), (got, head_out) = run(_decoder()), run(head)
    pair = protocol_rules.Pair(
        "m:X", "small", "C=8", got, want, head_out, base_out, stages=4, reduction=8
    )
    return [(r, m) for r, m in protocol_rules.judge(pair) if r == "protocol.decode-compile"]


def test_a_decoder_against_itself_keeps_its_compiled_steps() -> None:
    assert _decode_verdict(_decoder()) == []


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (_decoder(eager=True), "compile_step compiled nothing"),
        (_decoder(dynamic=False), "compiled steps made 3 graph(s) where the base's made"),
        (_decoder(skew=100.0), "choose other ids than the eager ones"),
    ],
)
def test_each_broken_decode_promise_is_found(head: Any, words: str) -> None:
    found = _decode_verdict(head)
    assert any(words in m for _, m in found), found


def test_the_decoders_come_from_the_specs_api() -> None:
    specs = load_specs(WorkingTree(GitRepo(ROOT)))
    kv_cache = [specs["kv_cache"]]  # a PR's closure: GPT is backbone_v1's, not kv_cache's
    found = protocol.decoders(kv_cache, list(specs.values()))
    want = ["niels_gpt.model.kv_cache:generate", "niels_gpt.model.kv_cache:generate"]
    assert found == [[*want, "niels_gpt.model.gpt:GPT"]]
    assert protocol.decoders([specs["rope"]], list(specs.values())) == []
