"""The example's model, data and training loop: plain PyTorch and DeepSpeed, no dsconf in here.

``examples/train.py`` calls ``train()`` with the DeepSpeed dict dsconf composed and validated;
``benchmarks/baseline_train.py`` calls it with the same dict read from a ``ds_config.json`` under a plain
``torchrun``. What a DeepSpeed training script needs is all here:

- ``deepspeed.initialize`` with the config dict; it builds the optimizer and LR scheduler the dict names;
- one ``engine(batch)`` / ``engine.backward`` / ``engine.step`` per micro-batch of
  ``train_micro_batch_size_per_gpu`` samples: the engine accumulates ``gradient_accumulation_steps`` of them
  into one optimizer step, which is what ``TrainConfig.steps`` counts (``engine.global_steps``);
- activation checkpointing through ``deepspeed.checkpointing`` when the dict has that section;
- checkpoints with ``engine.save_checkpoint`` / ``engine.load_checkpoint`` (every rank takes part);
- progress on rank 0 every ``steps_per_print`` steps (plus the first and the last), with a
  forward/backward/optimizer time breakdown when ``wall_clock_breakdown`` is on, and ``metrics.json``
  (with the loss of every step: ``dsconf report`` draws it as the job's loss curve).

The task is synthetic, so nothing is downloaded: token sequences from a fixed random Markov chain, and a tiny
causal transformer learns to predict the next token. The loss starts near ``ln(vocab_size)`` and falls towards
the chain's entropy.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

METRICS_FILE = "metrics.json"


@dataclass
class ModelConfig:
    vocab_size: int = 64
    seq_len: int = 32
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    ffn_mult: int = 4


@dataclass
class TrainConfig:
    steps: int = 30  # optimizer steps to reach (a resumed run continues from its checkpoint's step)
    seed: int = 1234
    checkpoint_dir: Optional[str] = None  # save DeepSpeed checkpoints here; resume from the latest one
    save_every: int = 0  # also save every N steps (0: only at the end)
    deepspeed_log_level: str = "warning"  # DeepSpeed's own logger; "info" shows its start-up report


# ----------------------------------------------------------------------------------------------- model
class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, cfg.ffn_mult * cfg.hidden), nn.GELU(),
                                 nn.Linear(cfg.ffn_mult * cfg.hidden, cfg.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, hidden // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A causal language model small enough to train on two CPU cores in seconds; returns the loss."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size)
        # deepspeed.checkpointing.checkpoint when activation checkpointing is on: each block's activations are
        # then recomputed in backward instead of being kept from forward
        self.checkpoint: Optional[Callable[..., torch.Tensor]] = None

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = self.checkpoint(block, x) if self.checkpoint is not None else block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# ------------------------------------------------------------------------------------------------ data
class MarkovData:
    """Sequences from a fixed random Markov chain in which each token has a few likely successors.

    Micro-batch ``index`` of rank ``rank`` is a pure function of ``(seed, rank, index)``: ranks never see the
    same batch, and a resumed run sees exactly the batches the first run would have seen next.
    """

    def __init__(self, cfg: ModelConfig, seed: int, successors: int = 2) -> None:
        g = torch.Generator().manual_seed(seed)
        likely = torch.rand(cfg.vocab_size, cfg.vocab_size, generator=g).argsort(dim=1)[:, :successors]
        logits = torch.full((cfg.vocab_size, cfg.vocab_size), -4.0).scatter_(1, likely, 2.0)
        self.transitions = logits.softmax(dim=1)
        self.cfg, self.seed = cfg, seed

    def batch(self, rank: int, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + rank * 7_919 + index)
        seq = torch.empty(size, self.cfg.seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(self.cfg.vocab_size, (size,), generator=g)
        for t in range(self.cfg.seq_len):
            seq[:, t + 1] = torch.multinomial(self.transitions[seq[:, t]], 1, generator=g).squeeze(1)
        return seq[:, :-1], seq[:, 1:]


# ------------------------------------------------------------------------------------ DeepSpeed set-up
def prepare_deepspeed_env() -> None:
    """Environment DeepSpeed reads when it is imported and when it JIT-builds its ops (call before importing it).

    - Without a GPU, select DeepSpeed's CPU accelerator explicitly (it would pick it itself, with a warning).
    - torch builds DeepSpeed's ops with the first ``ninja`` on PATH. A virtualenv has its own ninja, and two
      ninja versions do not read each other's build log, so alternating between them (venv activated or not)
      rebuilds the cached ops every time: always use the one next to this interpreter when there is one (dsconf's
      launcher does the same in every rank; this is for the example's training run without dsconf, under torchrun).
    """
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    bin_dir = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    if os.access(os.path.join(bin_dir, "ninja"), os.X_OK) and path[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *path])


def describe_dtype(ds_config: dict[str, Any]) -> str:
    for key in ("fp16", "bf16", "amp", "torch_autocast"):
        if (ds_config.get(key) or {}).get("enabled"):
            return key
    return "fp32"


# -------------------------------------------------------------------------------------------- training
@dataclass
class Progress:
    """What rank 0 reports: losses of the reported steps, throughput, and the time breakdown."""

    steps: int
    start_step: int
    train_batch_size: int
    every: int  # steps_per_print (0: only the first and the last step)
    breakdown: bool  # wall_clock_breakdown
    initial_loss: Optional[float] = None
    final_loss: Optional[float] = None
    timed_from: float = 0.0  # end of the first step: one-time costs (first forward, allocations) are excluded
    timed_to: float = 0.0
    since: float = 0.0  # start of the current print interval
    since_step: int = 0

    def reports(self, step: int) -> bool:
        """Steps whose loss is averaged over ranks and printed: the same decision on every rank."""
        return step in (self.start_step + 1, self.steps) or bool(self.every and step % self.every == 0)

    def samples_per_second(self) -> Optional[float]:
        timed = self.steps - self.start_step - 1
        if timed <= 0 or self.timed_to <= self.timed_from:
            return None
        return round(timed * self.train_batch_size / (self.timed_to - self.timed_from), 2)


def train(ds_config: dict[str, Any], model_cfg: ModelConfig, train_cfg: TrainConfig,
          out_dir: Optional[str]) -> dict[str, Any]:
    """Train on every rank of the running job; rank 0 prints progress and writes ``out_dir/metrics.json``."""
    prepare_deepspeed_env()
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(train_cfg.deepspeed_log_level.upper())
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(train_cfg.seed)  # the same initial weights on every rank
    model = TinyLM(model_cfg)
    n_params = sum(p.numel() for p in model.parameters())  # counted before ZeRO-3 partitions them
    data = MarkovData(model_cfg, train_cfg.seed)

    # DeepSpeed edits the dict it is given: hand it a copy and keep ours as it was saved in ds_config.json
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=copy.deepcopy(ds_config))
    if ds_config.get("activation_checkpointing") is not None:
        layers = ds_config["activation_checkpointing"].get("number_checkpoints") or model_cfg.layers
        deepspeed.checkpointing.configure(mpu_=None, deepspeed_config=copy.deepcopy(ds_config),
                                          num_checkpoints=layers)
        model.checkpoint = deepspeed.checkpointing.checkpoint

    start_step = resume(engine, train_cfg.checkpoint_dir, ds_config, rank)
    micro, gas, world = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(), engine.world_size
    progress = Progress(steps=train_cfg.steps, start_step=start_step, train_batch_size=engine.train_batch_size(),
                        every=ds_config.get("steps_per_print") or 0,
                        breakdown=bool(ds_config.get("wall_clock_breakdown")))
    if rank == 0:
        print(f"training {n_params:,} parameters, steps {start_step}..{train_cfg.steps}, on {world} rank(s): "
              f"ZeRO stage {engine.zero_optimization_stage()}, {describe_dtype(ds_config)}, "
              f"batch {engine.train_batch_size()} = {micro} per rank x {gas} accumulation x {world} ranks", flush=True)

    losses: list[torch.Tensor] = []  # this optimizer step's micro-batch losses
    # every optimizer step's loss, kept as tensors and averaged over ranks once at the end: one collective in
    # all (not one per step), and no device sync inside the loop
    step_losses: list[torch.Tensor] = []
    phases = dict.fromkeys(("forward", "backward", "optimizer"), 0.0)
    while engine.global_steps < train_cfg.steps:
        index = engine.global_steps * gas + len(losses)  # this rank's micro-batch number
        tokens, targets = (t.to(engine.device) for t in data.batch(rank, index, micro))
        t0 = time.perf_counter()
        loss = engine(tokens, targets)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        boundary = engine.is_gradient_accumulation_boundary()  # this micro-batch completes an optimizer step
        engine.step()  # the optimizer (and LR scheduler) step happens at the accumulation boundary only
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
        losses.append(loss.detach().float())
        if not boundary:
            continue
        step_loss = torch.stack(losses).mean()
        losses.clear()
        step_losses.append(step_loss)
        step = engine.global_steps
        if progress.reports(step):
            report(progress, step, mean_over_ranks(step_loss), engine.get_lr()[0], phases, rank)
            phases = dict.fromkeys(phases, 0.0)
        if train_cfg.checkpoint_dir and train_cfg.save_every and step % train_cfg.save_every == 0:
            save(engine, train_cfg.checkpoint_dir, ds_config, rank)

    if rank == 0 and start_step >= train_cfg.steps:
        print(f"nothing to train: the checkpoint is at step {start_step}, train.steps is {train_cfg.steps}", flush=True)
    if train_cfg.checkpoint_dir and not (train_cfg.save_every and engine.global_steps % train_cfg.save_every == 0):
        save(engine, train_cfg.checkpoint_dir, ds_config, rank)
    metrics = {
        "initial_loss": progress.initial_loss,
        "final_loss": progress.final_loss,
        "steps": engine.global_steps,
        "start_step": start_step,
        "world_size": world,
        "train_batch_size": engine.train_batch_size(),
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "samples_per_second": progress.samples_per_second(),
        "zero_stage": int(engine.zero_optimization_stage()),
        "dtype": describe_dtype(ds_config),
        "activation_checkpointing": model.checkpoint is not None and deepspeed.checkpointing.is_configured(),
        # [step, loss averaged over ranks] for every step this run trained (a resumed run starts after its
        # checkpoint's step)
        "losses": [[start_step + 1 + i, round(loss, 5)] for i, loss in enumerate(means_over_ranks(step_losses))],
    }
    if rank == 0 and out_dir:
        with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as fh:
            json.dump(metrics, fh, indent=2)
            fh.write("\n")
    return metrics


def report(progress: Progress, step: int, loss: float, lr: float, phases: dict[str, float], rank: int) -> None:
    """Record a reported step; rank 0 prints ``step, loss, samples/s, lr`` (and the breakdown if asked)."""
    now = time.perf_counter()
    first = progress.initial_loss is None
    if first:
        progress.initial_loss, progress.timed_from = loss, now
    progress.final_loss, progress.timed_to = loss, now
    line = f"step {step:>{len(str(progress.steps))}}/{progress.steps}  loss {loss:.4f}"
    if not first:
        rate = (step - progress.since_step) * progress.train_batch_size / (now - progress.since)
        line += f"  {rate:,.0f} samples/s"
    line += f"  lr {lr:.3g}"
    if progress.breakdown and not first:
        ms = {k: 1000 * v / (step - progress.since_step) for k, v in phases.items()}
        line += "  | ms/step: " + ", ".join(f"{k} {v:.1f}" for k, v in ms.items())
    progress.since, progress.since_step = now, step
    if rank == 0:
        print(line, flush=True)


def means_over_ranks(values: list[torch.Tensor]) -> list[float]:
    """Each value averaged over ranks, in one all-reduce; every rank has as many values (the same steps)."""
    if not values:
        return []
    import deepspeed.comm as ds_dist

    stacked = torch.stack([v.detach().float() for v in values])
    ds_dist.all_reduce(stacked)
    return (stacked / ds_dist.get_world_size()).tolist()


def mean_over_ranks(value: torch.Tensor) -> float:
    import deepspeed.comm as ds_dist

    value = value.detach().float().clone()
    ds_dist.all_reduce(value)
    return value.item() / ds_dist.get_world_size()


# ---------------------------------------------------------------------------------------- checkpoints
def save(engine: Any, checkpoint_dir: str, ds_config: dict[str, Any], rank: int) -> None:
    """Every rank writes its part; the DeepSpeed dict travels along, so that a resumed run can compare."""
    engine.save_checkpoint(checkpoint_dir, client_state={"ds_config": ds_config})
    if rank == 0:
        print(f"saved the checkpoint of step {engine.global_steps} in {checkpoint_dir}", flush=True)


def resume(engine: Any, checkpoint_dir: Optional[str], ds_config: dict[str, Any], rank: int) -> int:
    """Load the latest checkpoint in ``checkpoint_dir`` if there is one; returns the step it was saved at."""
    if not checkpoint_dir or not os.path.exists(os.path.join(checkpoint_dir, "latest")):
        return 0
    path, client_state = engine.load_checkpoint(checkpoint_dir)
    if path is None:
        raise RuntimeError(f"could not load the DeepSpeed checkpoint in {checkpoint_dir}")
    saved = (client_state or {}).get("ds_config")
    if rank == 0:
        print(f"resumed from step {engine.global_steps} ({path})", flush=True)
        if saved is not None and saved != ds_config:
            changed = sorted(k for k in set(saved) | set(ds_config) if saved.get(k) != ds_config.get(k))
            print(f"note: the DeepSpeed config differs from the checkpoint's in: {', '.join(changed)}", flush=True)
    return int(engine.global_steps)
