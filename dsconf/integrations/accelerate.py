"""Accelerate on dsconf's config: ``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=<job's dict>))`` in ranks
started by dsconf's launcher (not ``accelerate launch``).

Accelerate reads the torch elastic variables dsconf's ranks have (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
so nothing else is needed to start it. ``accelerator()`` also gives Accelerate the settings it would otherwise
take from ``accelerate config`` and then reconcile with the DeepSpeed dict: the mixed precision and gradient
accumulation the dict says, so both sides agree. The dict is dsconf's validated export (``ds_config.json``):
its batch triple is already derived for the job's world size, so no "auto" is needed.
"""

from __future__ import annotations

from typing import Any, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.integrations import check_world, half_precision

INSTALL_HINT = "install Accelerate: pip install 'dsconf[hf]'"


def mixed_precision(deepspeed: dict) -> str:
    """Accelerate's ``mixed_precision`` for a DeepSpeed dict: what its fp16/bf16 sections enable."""
    return half_precision(deepspeed) or "no"


def deepspeed_plugin(deepspeed: Optional[dict] = None, **plugin_kwargs: Any) -> Any:
    """``DeepSpeedPlugin(hf_ds_config=...)`` for this rank's job (``deepspeed``: a dict instead of the job's)."""
    from dsconf.launch import context

    try:
        from accelerate.utils import DeepSpeedPlugin
    except ImportError as err:
        raise ConfigError(Problem("deepspeed", f"Accelerate is not installed ({err})", INSTALL_HINT)) from None
    return DeepSpeedPlugin(hf_ds_config=deepspeed if deepspeed is not None else context.deepspeed_config(),
                           **plugin_kwargs)


def accelerator(deepspeed: Optional[dict] = None, **accelerator_kwargs: Any) -> Any:
    """An ``Accelerator`` running this rank's job's DeepSpeed dict, its precision and accumulation taken from it.

    On DeepSpeed's CPU accelerator the process group is gloo's: Accelerate finds no device backend on a CPU host
    and would count one process per rank (no data sharded) while DeepSpeed averages gradients over all of them.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from dsconf.launch import context

    ds = deepspeed if deepspeed is not None else context.deepspeed_config()
    accelerator_kwargs.setdefault("mixed_precision", mixed_precision(ds))
    accelerator_kwargs.setdefault("gradient_accumulation_steps", int(ds.get("gradient_accumulation_steps", 1)))
    handlers = list(accelerator_kwargs.pop("kwargs_handlers", None) or [])
    if _deepspeed_on_cpu() and not any(isinstance(h, InitProcessGroupKwargs) for h in handlers):
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    acc = Accelerator(deepspeed_plugin=deepspeed_plugin(ds), kwargs_handlers=handlers, **accelerator_kwargs)
    check_world(acc.num_processes, "Accelerate", "kwargs_handlers=[InitProcessGroupKwargs(backend='gloo')]")
    return acc


def _deepspeed_on_cpu() -> bool:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"
