"""Train the tiny transformer of ``examples/train.py`` with Accelerate and DeepSpeed, launched by dsconf.

    python examples/accelerate_train.py                        # 1 rank, ZeRO-2, bf16
    python examples/accelerate_train.py dist.nproc_per_node=2 zero=stage3

No ``accelerate launch`` and no ``accelerate config``: dsconf starts the ranks (torch elastic), and each rank's
``Accelerator`` gets this job's validated DeepSpeed dict (``ds_config.json``) through
``dsconf.integrations.accelerate.accelerator()``. The optimizer and scheduler are DeepSpeed's, from the config:
the code passes Accelerate's ``DummyOptim`` and ``DummyScheduler`` placeholders, as Accelerate requires.
"""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig, OmegaConf
from training import MarkovData, ModelConfig, TinyLM, prepare_deepspeed_env  # examples/training.py

import dsconf


class Batches(torch.utils.data.Dataset):
    """``MarkovData``'s sequences as a map-style dataset, so Accelerate shards it over the ranks."""

    def __init__(self, data: MarkovData, examples: int) -> None:
        self.tokens, self.targets = data.batch(rank=0, index=0, size=examples)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple:
        return self.tokens[i], self.targets[i]


def train(cfg: DictConfig) -> tuple:
    """Train on this rank; returns (Accelerator, engine, losses)."""
    prepare_deepspeed_env()
    from accelerate.utils import DummyOptim, DummyScheduler

    from dsconf.integrations.accelerate import accelerator

    acc = accelerator()
    ds = acc.state.deepspeed_plugin.deepspeed_config
    torch.manual_seed(cfg.train.seed)
    model_cfg = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    model = TinyLM(model_cfg)
    data = Batches(MarkovData(model_cfg, cfg.train.seed), cfg.train.examples)
    loader = torch.utils.data.DataLoader(data, batch_size=ds["train_micro_batch_size_per_gpu"], shuffle=True)
    optimizer = DummyOptim(model.parameters())
    scheduler = DummyScheduler(optimizer) if "scheduler" in ds else None
    engine, optimizer, loader, *rest = acc.prepare(model, optimizer, loader, *([scheduler] if scheduler else []))
    losses, step = [], 0
    while step < cfg.train.steps:
        for tokens, targets in loader:
            with acc.accumulate(engine):
                loss = engine(tokens, targets)
                acc.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step == cfg.train.steps:
                break
    return acc, engine, losses


@dsconf.main(config_path="conf", config_name="accelerate_train", version_base=None)
def main(cfg: DictConfig) -> float:
    _, engine, losses = train(cfg)
    if os.environ.get("RANK", "0") == "0":
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps on {engine.world_size} rank(s)",
              flush=True)
    return float(losses[-1])


if __name__ == "__main__":
    main()
