"""Train a tiny GPT-2 with HF Transformers' Trainer and DeepSpeed, configured and launched by dsconf.

    python examples/hf_trainer.py                                   # 1 rank, ZeRO-2, bf16
    python examples/hf_trainer.py zero=stage3 dist.nproc_per_node=2
    python examples/hf_trainer.py training_args.learning_rate=1e-3 training_args.per_device_train_batch_size=4

The configuration is ``examples/conf/hf_trainer.yaml``: dsconf's base config, ``training_args`` (TrainingArguments'
fields) and ``model`` (GPT2Config's). Its DeepSpeed keys are HF's "auto": dsconf fills them before any rank starts,
exactly as the Trainer would (``dsconf.hf_auto``), so ``ds_config.json`` holds what the engine runs, and a
value that disagrees with ``training_args`` is refused on the command line instead of inside the job.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import dsconf


class Sequences(torch.utils.data.Dataset):
    """Synthetic next-token data with structure to learn: each sequence counts up from a random start."""

    def __init__(self, examples: int, seq_len: int, vocab: int) -> None:
        starts = torch.randint(0, vocab, (examples, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(seq_len)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_trainer(cfg: DictConfig) -> Any:
    """The Trainer for this rank: TrainingArguments from ``cfg.training_args`` with this job's DeepSpeed dict."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    from dsconf.integrations.hf import training_arguments

    args = training_arguments(cfg)  # TrainingArguments(**cfg.training_args, deepspeed=<this job's ds_config.json>)
    model = GPT2LMHeadModel(GPT2Config(**OmegaConf.to_container(cfg.model), bos_token_id=0, eos_token_id=0))
    data = Sequences(cfg.data.examples, cfg.data.seq_len, cfg.model.vocab_size)
    return Trainer(model=model, args=args, train_dataset=data)


@dsconf.main(config_path="conf", config_name="hf_trainer", version_base=None)
def main(cfg: DictConfig) -> float:
    trainer = build_trainer(cfg)
    result = trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log] or [result.training_loss]
    if os.environ.get("RANK", "0") == "0":
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"{result.metrics['train_samples_per_second']:,.0f} samples/s", flush=True)
    return float(losses[-1])


if __name__ == "__main__":
    main()
