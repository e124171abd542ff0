"""The training loop of ``niels-train``: one function, ``train``.

Per optimizer step: the step's global batch (``batches``), this rank's
micro-batches with gradient accumulation (gradients reduced on the last one),
optional autocast, gradient clipping, AdamW, the warm-up + cosine schedule.
Every ``eval_every`` steps: validation loss and a greedy and a sampled
continuation; checkpoints at every evaluation (or every ``checkpoint_every``
steps), after a step that ends ``checkpoint_minutes`` after the last one, at
``stop_after``, at the end, and on Ctrl+C (``interrupt``: the step finishes,
is saved, and ``TrainingInterrupted`` is raised). A resumed run restores model,
optimizer, scheduler, gradient scaler, RNG states and step, and continues the
same loss curve.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from niels_gpt_experiments import checkpoint
from niels_gpt_experiments.batches import Layout, read_rows, train_offsets
from niels_gpt_experiments.config import AUTOCAST_DTYPES, TrainConfig, check_same_run
from niels_gpt_experiments.corpus import Corpus, open_corpus
from niels_gpt_experiments.evaluation import evaluate, next_token_loss, show_samples
from niels_gpt_experiments.interrupt import StopRequest, TrainingInterrupted
from niels_gpt_experiments.loading import model_record
from niels_gpt_experiments.models import build_model, n_params
from niels_gpt_experiments.parallel import Mode, check_tied, choose_mode, gradient_sync, wrap
from niels_gpt_experiments.progress import Display, MetricsLog
from niels_gpt_experiments.rundir import RunExistsError, claim_out_dir
from niels_gpt_experiments.runtime import Runtime, all_gather_objects, all_reduce_sum, barrier
from niels_gpt_experiments.runtime import start as start_runtime
from niels_gpt_experiments.runtime import stop as stop_runtime
from niels_gpt_experiments.schedule import make_scheduler

__all__ = ["RunExistsError", "TrainResult", "TrainingInterrupted", "accumulate_gradients", "train"]


@dataclass
class TrainResult:
    """What one call of ``train`` did (on rank 0; other ranks get the same minus state)."""

    config: TrainConfig
    mode: Mode
    world: int
    rank: int
    n_params: int
    first_step: int  # 0, or the checkpoint step this run resumed from
    losses: dict[int, float] = field(default_factory=dict)  # step -> train loss
    val_losses: dict[int, float] = field(default_factory=dict)  # step -> validation loss
    step_seconds: list[float] = field(default_factory=list)  # each step's own compute
    seconds: float = 0.0  # wall time from this run's first step to the end of its last
    corpus_meta: dict[str, Any] = field(default_factory=dict)
    final_state: dict[str, torch.Tensor] | None = None  # full weights, with keep_state

    @property
    def tokens_per_s(self) -> float:
        """The run's throughput, the one figure niels-train and niels-ablate show.

        Tokens this run trained (its steps times ``tokens_per_step``) over the
        wall time from the start of its first step to the end of its last,
        evaluations, samples and checkpoints included: the rate at which the
        run gets through its tokens. The progress bar shows it so far, each
        ``metrics.jsonl`` step line records it so far, the closing line and
        ``niels-ablate`` the final value. NaN before the first step.
        """
        if not self.losses or self.seconds <= 0:
            return float("nan")
        return len(self.losses) * self.config.tokens_per_step / self.seconds


def _autocast(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[object]:
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[cfg.precision])


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (and the tied embedding), not on biases or norms."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def _restore_rng(
    states: list[dict[str, torch.Tensor | None]],
    cfg: TrainConfig,
    runtime: Runtime,
    step: int,
    display: Display,
) -> None:
    """This rank's saved RNG states; on another world size, a fresh seed per rank."""
    if len(states) != runtime.world:  # the dropout streams cannot continue: reseed them
        torch.manual_seed(cfg.seed + 1 + runtime.rank + 7919 * step)
        display.say(
            f"note: RNG states saved by {len(states)} ranks, now {runtime.world}; "
            "dropout streams reseeded"
        )
        return
    mine = states[runtime.rank]
    cpu, cuda = mine["cpu"], mine["cuda"]
    if cpu is not None:
        torch.set_rng_state(cpu)
    if cuda is not None and runtime.device.type == "cuda":
        torch.cuda.set_rng_state(cuda, runtime.device)


def _open_corpus(cfg: TrainConfig, runtime: Runtime) -> Corpus:
    if runtime.is_main:  # rank 0 builds the arrays once; the others map them
        corpus = open_corpus(cfg.corpus_spec(), cfg.data_dir)
    barrier(runtime)
    if not runtime.is_main:
        corpus = open_corpus(cfg.corpus_spec(), cfg.data_dir)
    return corpus


def train(cfg: TrainConfig, *, keep_state: bool = False) -> TrainResult:
    """Run (or resume) the training ``cfg`` describes; see the module docstring.

    Under ``torchrun`` every rank calls this. ``keep_state`` returns the full
    final weights in ``TrainResult.final_state`` on rank 0.

    Raises:
        ValueError, CorpusError: bad settings or corpus.
        CheckpointError: ``--resume`` onto a checkpoint of different settings.
        RunExistsError: ``out_dir`` holds a run, and ``cfg`` neither resumes nor overwrites.
        TiedWeightError: the embedding/head tie broke (never expected).
        TrainingInterrupted: Ctrl+C (a ``KeyboardInterrupt``) during the steps; it
            names the checkpoint saved at the interrupt, or the last one before.
    """
    runtime = start_runtime(cfg.device, need_group=cfg.fsdp)
    try:
        return _train(cfg, runtime, keep_state)
    finally:
        stop_runtime(runtime)


def accumulate_gradients(
    engine: torch.nn.Module,
    mode: Mode,
    tokens: np.ndarray[Any, np.dtype[np.uint8]],
    offsets: torch.Tensor,
    layout: Layout,
    T: int,
    autocast: contextlib.AbstractContextManager[object],
    scaler: torch.amp.GradScaler,
) -> torch.Tensor:
    """Forward and backward over this rank's micro-batches of one step.

    Each micro-batch's mean loss is divided by ``layout.accum``, so the
    gradients add up to those of the mean loss over this rank's rows; across
    ranks they are reduced (averaged) on the last micro-batch only.

    Args:
        offsets: ``(batch_size,)`` window starts of the step's global batch.

    Returns:
        The loss of this rank's rows, a 0-d tensor (detached).
    """
    device = next(engine.parameters()).device
    loss_sum = torch.zeros((), device=device)
    for micro in range(layout.accum):
        x, y = read_rows(tokens, offsets[layout.rows(micro)], T, device)  # (b, T) each
        with gradient_sync(engine, mode, micro == layout.accum - 1):
            loss = next_token_loss(engine, x, y, autocast) / layout.accum  # ()
            torch.autograd.backward(scaler.scale(loss))
        loss_sum += loss.detach().to(loss_sum.dtype)
    return loss_sum


def _train(cfg: TrainConfig, runtime: Runtime, keep_state: bool) -> TrainResult:
    claim_out_dir(cfg, runtime.is_main)  # before any collective: every rank decides alike
    device = runtime.device
    layout = Layout(cfg.batch_size, runtime.world, runtime.rank, cfg.grad_accum)
    corpus = _open_corpus(cfg, runtime)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg.model, cfg.model_config())
    if cfg.attention == "fast":
        from niels_gpt.model.fastpath import use_fast_attention

        use_fast_attention(model)
    model.to(device)
    mode = choose_mode(cfg.fsdp, runtime.world)
    engine = wrap(model, mode, runtime)
    optimizer = _optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    display = Display(runtime.is_main, cfg.steps, bar=cfg.progress, every_s=cfg.progress_seconds)

    found = checkpoint.latest(cfg.out_dir) if cfg.resume else None
    if found is not None:
        state = checkpoint.load(found, model, optimizer, runtime)
        check_same_run(state["config"], cfg)
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        first = int(state["step"])
        _restore_rng(state["rng"], cfg, runtime, first, display)
        display.say(f"resumed from {found.name} at step {first}")
    else:
        first = 0
        torch.manual_seed(cfg.seed + 1 + runtime.rank)  # each rank its own dropout stream
    if cfg.compile:
        engine = torch.compile(engine)  # type: ignore[assignment]

    result = TrainResult(
        cfg, mode, runtime.world, runtime.rank, n_params(model), first, corpus_meta=corpus.meta
    )
    log = MetricsLog(cfg.out_dir / "metrics.jsonl", runtime.is_main, first if found else None)
    autocast = _autocast(cfg, device)
    last = min(cfg.steps, cfg.stop_after or cfg.steps)
    display.say(
        f"{cfg.model}: {result.n_params:,} parameters, {mode} on {runtime.world} rank(s), "
        f"{device}, {cfg.precision}; corpus {corpus.meta['source']} "
        f"({corpus.meta['bytes']['train']:,} train / {corpus.meta['bytes']['val']:,} val bytes, "
        f"{corpus.meta['python']})"
    )
    if runtime.is_main:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        meta = {
            **model_record(cfg.model, cfg.model_config()),
            "config": cfg.as_json(),
            "corpus": corpus.meta,
            "params": result.n_params,
        }
        (cfg.out_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n")

    started = time.perf_counter()  # result.seconds counts from here
    saved_at = time.monotonic()  # of the last checkpoint (or the start), for checkpoint_minutes
    latest = found  # the run's newest checkpoint
    done = first
    stop = StopRequest()
    try:
        with stop.catching(), display.running(first):
            for step in range(first, last):
                t0 = time.perf_counter()
                offsets = train_offsets(cfg.seed, step, cfg.batch_size, len(corpus.train), cfg.T)
                loss_sum = accumulate_gradients(
                    engine, mode, corpus.train, offsets, layout, cfg.T, autocast, scaler
                )
                if cfg.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                lr = scheduler.get_last_lr()[0]
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                # Loss, Ctrl+C and the clock in one reduction: every rank stops and saves alike.
                late = cfg.checkpoint_minutes > 0 and (
                    time.monotonic() - saved_at >= 60 * cfg.checkpoint_minutes
                )
                wants = torch.tensor([float(stop.requested), float(late)], device=device)  # (2,)
                summed = all_reduce_sum(runtime, torch.cat([loss_sum.reshape(1), wants]))  # (3,)
                mean_loss = float(summed[0]) / runtime.world
                stopping, late = bool(summed[1] > 0), bool(summed[2] > 0)
                seconds = time.perf_counter() - t0
                done = step + 1
                result.losses[done] = mean_loss
                result.step_seconds.append(seconds)

                due = done % cfg.eval_every == 0 or done == cfg.steps
                if due:
                    val = evaluate(cfg, model, corpus.val, layout.micro, runtime, autocast)
                    result.val_losses[done] = val
                    log.write(step=done, val_loss=val, tokens=done * cfg.tokens_per_step)
                    display.say(f"step {done}: val loss {val:.4f}, train loss {mean_loss:.4f}")
                    show_samples(cfg, model, runtime, autocast, mode, done, display)
                every = cfg.checkpoint_every
                scheduled = due if every is None else done % every == 0
                if scheduled or late or stopping or done == last:
                    saved = {
                        "step": done,
                        "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict(),
                        "rng": all_gather_objects(runtime, _rng_state(device)),
                        "config": json.dumps(cfg.as_json()),
                    }
                    latest = checkpoint.save(
                        cfg.out_dir, done, model, optimizer, saved, runtime, cfg.keep_checkpoints
                    )
                    saved_at = time.monotonic()
                result.seconds = time.perf_counter() - started  # this step's eval and save in
                display.step(done, mean_loss, result.tokens_per_s)
                log.write(
                    step=done,
                    loss=mean_loss,
                    lr=lr,
                    tokens=done * cfg.tokens_per_step,
                    tokens_per_s=result.tokens_per_s,
                    step_seconds=seconds,
                )
                if stopping and done < last:
                    raise TrainingInterrupted(done, latest, saved_now=True, rank=runtime.rank)
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:  # a second Ctrl+C, mid-step: no save, the last one stands
        raise TrainingInterrupted(done, latest, saved_now=False, rank=runtime.rank) from None
    check_tied(model)
    if keep_state:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)
        result.final_state = {
            k: v.detach().clone() for k, v in full.items() if isinstance(v, torch.Tensor)
        }
    return result
