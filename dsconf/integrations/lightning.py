"""Lightning on dsconf's config: ``DeepSpeedStrategy(config=<job's dict>)`` in ranks started by dsconf's launcher.

dsconf's ranks carry torch elastic's variables, so Lightning picks its ``TorchElasticEnvironment`` and starts no
process of its own, provided its ``devices`` and ``num_nodes`` are the job's (``trainer_kwargs()`` gives them).
Lightning owns two of the dict's keys through its own Trainer arguments and refuses them in the config
("Do not set gradient_accumulation_steps in the DeepSpeed config"): ``trainer_kwargs()`` moves
``gradient_accumulation_steps`` to ``accumulate_grad_batches``, and the fp16/bf16 sections to ``precision``, so the
engine Lightning builds runs ``ds_config.json`` as validated. Lightning's DeepSpeed strategy needs CUDA GPUs.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.integrations import half_precision

INSTALL_HINT = "install Lightning: pip install lightning"
OWNED_BY_TRAINER = {"gradient_accumulation_steps": "accumulate_grad_batches"}


def precision(deepspeed: dict) -> str:
    """Lightning's ``precision`` for a DeepSpeed dict."""
    return {"bf16": "bf16-mixed", "fp16": "16-mixed", None: "32-true"}[half_precision(deepspeed)]


def trainer_kwargs(deepspeed: Optional[dict] = None, **strategy_kwargs: Any) -> Dict[str, Any]:
    """``lightning.Trainer`` arguments for this rank: the DeepSpeed strategy with the job's dict, the job's devices
    and nodes, and the Trainer arguments that stand for the dict's keys Lightning refuses."""
    from dsconf.launch import context

    try:
        from lightning.pytorch.strategies import DeepSpeedStrategy
    except ImportError as err:
        raise ConfigError(Problem("deepspeed", f"Lightning is not installed ({err})", INSTALL_HINT)) from None
    ds = deepspeed if deepspeed is not None else context.deepspeed_config()
    kwargs: Dict[str, Any] = {trainer_key: ds.pop(key) for key, trainer_key in OWNED_BY_TRAINER.items() if key in ds}
    kwargs.update(strategy=DeepSpeedStrategy(config=ds, **strategy_kwargs), precision=precision(ds), **job_devices())
    return kwargs


def job_devices() -> Dict[str, int]:
    """``devices`` and ``num_nodes`` of this job, as Lightning must be told them under an external launcher."""
    import os

    from dsconf.launch import context

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return {"devices": local, "num_nodes": max(context.world_size() // local, 1)}
