"""Train the tiny transformer of ``examples/train.py`` with Lightning's DeepSpeed strategy, launched by dsconf.

    python examples/lightning_train.py                          # 1 GPU, ZeRO-2, bf16
    python examples/lightning_train.py dist.nproc_per_node=2

Lightning's DeepSpeed strategy runs on CUDA GPUs only. dsconf starts the ranks (torch elastic); Lightning sees
torch elastic's environment and starts none of its own. ``dsconf.integrations.lightning.trainer_kwargs()`` gives
the strategy this job's validated DeepSpeed dict (``ds_config.json``), the job's devices and nodes, and moves the
keys Lightning owns (``gradient_accumulation_steps``, the precision) to its Trainer arguments.
"""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig, OmegaConf
from training import MarkovData, ModelConfig, TinyLM, prepare_deepspeed_env  # examples/training.py

import dsconf


def lightning_module(cfg: DictConfig, lr_from: dict) -> torch.nn.Module:
    import lightning

    class TinyLMModule(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = TinyLM(ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True)))
            self.losses: list = []

        def training_step(self, batch: tuple, index: int) -> torch.Tensor:
            loss = self.model(*batch)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:  # unused when the config has an optimizer
            return torch.optim.AdamW(self.parameters(), lr=lr_from["optimizer"]["params"]["lr"])

    return TinyLMModule()


def train(cfg: DictConfig, **trainer_kwargs: object) -> tuple:
    """Train on this rank; returns (Trainer, module)."""
    prepare_deepspeed_env()
    import lightning

    from dsconf.integrations.lightning import trainer_kwargs as dsconf_trainer_kwargs
    from dsconf.launch.context import deepspeed_config

    torch.manual_seed(cfg.train.seed)
    ds = deepspeed_config()
    model_cfg = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    data = MarkovData(model_cfg, cfg.train.seed)
    tokens, targets = data.batch(rank=0, index=0, size=cfg.train.examples)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens, targets),
                                         batch_size=ds["train_micro_batch_size_per_gpu"], shuffle=True)
    trainer = lightning.Trainer(**dsconf_trainer_kwargs(), max_steps=cfg.train.steps, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, **trainer_kwargs)
    module = lightning_module(cfg, ds)
    trainer.fit(module, loader)
    return trainer, module


@dsconf.main(config_path="conf", config_name="lightning_train", version_base=None)
def main(cfg: DictConfig) -> float:
    _, module = train(cfg)
    losses = module.losses
    if os.environ.get("RANK", "0") == "0":
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps", flush=True)
    return float(losses[-1])


if __name__ == "__main__":
    main()
