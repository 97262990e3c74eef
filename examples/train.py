"""Train a tiny transformer with DeepSpeed, configured and launched by dsconf.

    python examples/train.py                                           # 1 rank, ZeRO-0, fp32
    python examples/train.py zero=stage2 precision=bf16 dist.nproc_per_node=2
    python examples/train.py experiment=small_zero2_bf16_warmup        # a preset from examples/conf/experiment/
    python examples/train.py -m zero=stage0,stage1,stage2 precision=fp32,bf16   # a sweep: one job per combination
    python examples/train.py -m hydra/sweeper=dsconf_tune dist.nproc_per_node=2   # the fastest config that fits
    python examples/train.py train.checkpoint_dir=ckpt                 # saves in ckpt/ at step 30, and then
    python examples/train.py train.checkpoint_dir=ckpt train.steps=60  # resumes there and trains to step 60

The configuration is ``examples/conf/train.yaml``: dsconf's base config (the ``deepspeed`` node, ``dist`` and
the groups ``zero=``, ``precision=``, ``optimizer=``, ``scheduler=``, ``activation_checkpointing=``) plus this
example's ``model`` and ``train`` keys, typed by the dataclasses in ``examples/training.py``.

``@dsconf.main`` composes and validates the config once, in this process, writes the exact DeepSpeed dict to
``<output dir>/ds_config.json``, then runs ``main`` on every rank. Each rank reads that same dict with
``deepspeed_config()`` and hands it to ``deepspeed.initialize`` (in ``training.train``); rank 0 writes
``metrics.json`` next to ``ds_config.json``.
"""

from __future__ import annotations

import os

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from training import ModelConfig, TrainConfig, train  # examples/training.py, next to this script

import dsconf

# Types for the example's own keys: `train.step=5` or `model.hidden=big` fail before any rank starts.
ConfigStore.instance().store(name="train_schema", node={"model": ModelConfig, "train": TrainConfig})


@dsconf.main(config_path="conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> float:
    from dsconf.launch.context import deepspeed_config, job_dir, report_sequence_length

    report_sequence_length(cfg.model.seq_len)  # a tuning trial (hydra/sweeper=dsconf_tune) then reports tokens/s
    model_cfg = ModelConfig(**OmegaConf.to_container(cfg.model, resolve=True))
    train_cfg = TrainConfig(**OmegaConf.to_container(cfg.train, resolve=True))
    m = train(deepspeed_config(), model_cfg, train_cfg, out_dir=job_dir())
    if os.environ.get("RANK", "0") == "0" and m["final_loss"] is not None:
        print(f"loss {m['initial_loss']:.3f} -> {m['final_loss']:.3f}, {m['samples_per_second'] or 0:,.0f} samples/s",
              flush=True)
    # Rank 0's return value is the job's result: a number, because Hydra's Optuna sweeper refuses a return value
    # that is not float-castable, and a sweep's summary makes a number its `return` column. NaN when nothing
    # was trained (the checkpoint already had train.steps): there is no loss to report.
    return float(m["final_loss"]) if m["final_loss"] is not None else float("nan")


if __name__ == "__main__":
    main()
