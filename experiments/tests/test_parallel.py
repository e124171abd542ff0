"""FSDP2 wrapping keeps the tied embedding/head as one parameter (one-rank group, in process)."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.parallel import TiedWeightError, check_tied, choose_mode, wrap
from niels_gpt_experiments.runtime import Runtime, start, stop

CFG = ModelConfig(V=64, T=8, C=16, L=2, H=2, d_ff=16, dropout=0.0)


@pytest.fixture
def group() -> Iterator[Runtime]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield Runtime(0, 1, torch.device("cpu"), owns_group=True)
    finally:
        dist.destroy_process_group()


def test_fsdp_wrap_keeps_one_tied_parameter_through_training(group: Runtime) -> None:
    model = GPT(CFG)
    count = len(list(model.parameters()))
    engine = wrap(model, "fsdp", group)
    assert engine is model
    assert model.lm_head.weight is model.tok_emb.weight
    assert isinstance(model.tok_emb.weight, DTensor)
    assert len(list(model.parameters())) == count  # the shared weight is still listed once
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        x = torch.randint(0, CFG.V, (2, 8))
        torch.autograd.backward(model(x).logsumexp(-1).mean())
        opt.step()
        opt.zero_grad()
        check_tied(model)


def test_sharding_embedding_and_head_apart_breaks_the_tie(group: Runtime) -> None:
    """The failure the root-group wrapping avoids (torchtune#616's symptom)."""
    model = GPT(CFG)
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model.tok_emb, mesh=mesh)
    fully_shard(model.lm_head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with pytest.raises(TiedWeightError, match="the tie is broken"):
        check_tied(model)


def test_modes() -> None:
    assert choose_mode(fsdp=False, world=1) == "single"
    assert choose_mode(fsdp=False, world=2) == "ddp"
    assert choose_mode(fsdp=True, world=1) == "fsdp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_start_joins_a_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torchrun hands each rank: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    runtime = start("cpu", need_group=False, timeout=dt.timedelta(seconds=30))
    try:
        assert dist.is_initialized() and runtime.owns_group and runtime.distributed
        assert (runtime.rank, runtime.world, runtime.device.type) == (0, 1, "cpu")
        assert dist.get_backend() == "gloo"
    finally:
        stop(runtime)
    assert not dist.is_initialized()


def test_start_makes_a_one_rank_group_only_when_asked() -> None:
    plain = start("cpu", need_group=False)
    assert not plain.distributed and not plain.owns_group and plain.world == 1
    sharded = start("cpu", need_group=True)
    try:
        assert sharded.distributed and sharded.owns_group and dist.get_world_size() == 1
    finally:
        stop(sharded)
    assert not dist.is_initialized()
