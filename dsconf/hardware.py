"""What the machine a job is about to run on can do: a precision DeepSpeed's accelerator lacks is refused before launch.

Composing and validating stay hardware-agnostic (a config for a GPU cluster can be checked on a laptop);
this check runs only where ranks are about to start. The judge is DeepSpeed's own accelerator
(``deepspeed.accelerator.get_accelerator()``, which honours ``DS_ACCELERATOR``), the one every rank will use,
and it is asked only when the config enables what depends on it: fp16, Apex AMP, GPUDirect Storage (aio.use_gds). It
is asked without initialising CUDA in this process (ranks may be forked from it): with
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` DeepSpeed's detection counts devices through NVML, and for CUDA the visible
device count stands for ``is_fp16_supported()``, which would create a CUDA context (the compute capability is left
to the ranks).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from dsconf.errors import Problem
from dsconf.schema.root import DEEPSPEED_NODE
from dsconf.world import visible_gpu_count

# the keys a refusal names
FP16_KEY, AMP_KEY, GDS_KEY = (f"{DEEPSPEED_NODE}.fp16.enabled", f"{DEEPSPEED_NODE}.amp.enabled",
                              f"{DEEPSPEED_NODE}.aio.use_gds")


@dataclass(frozen=True)
class Accelerator:
    """What DeepSpeed's accelerator on this host offers: its name, its devices, whether fp16 trains on it."""

    name: str
    devices: int
    fp16: bool


def this_host_accelerator() -> Accelerator:
    """DeepSpeed's accelerator here; without DeepSpeed installed, CUDA if a GPU is visible, else the CPU."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if importlib.util.find_spec("deepspeed") is None:
        gpus = visible_gpu_count()
        return Accelerator("cuda" if gpus else "cpu", gpus, gpus > 0)
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    name = str(accelerator.device_name())
    if name == "cuda":
        gpus = visible_gpu_count()
        return Accelerator(name, gpus, gpus > 0)
    return Accelerator(name, int(accelerator.device_count() or 0), bool(accelerator.is_fp16_supported()))


def hardware_problems(ds: Dict[str, Any], *, accelerator: Optional[Accelerator] = None) -> List[Problem]:
    """Problems running ``ds`` (an exported DeepSpeed dict) here; ``accelerator`` defaults to this host's."""
    # `is True`: with keep_auto, "auto" is HF's to decide
    fp16 = (ds.get("fp16") or {}).get("enabled") is True
    amp = (ds.get("amp") or {}).get("enabled") is True
    gds = bool((ds.get("aio") or {}).get("use_gds"))
    if not (fp16 or amp or gds):
        return []
    accel = accelerator or this_host_accelerator()
    chosen = f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}" if os.environ.get("DS_ACCELERATOR") else "detected"
    where = f"DeepSpeed's {accel.name} accelerator ({chosen})"
    problems = []
    if fp16 and not accel.fp16:
        why = "no CUDA GPU is visible" if accel.name == "cuda" else "it does not support fp16"
        problems.append(Problem(FP16_KEY, f"fp16 training needs an accelerator that supports it: "
                                f"{where} is the one ranks will use here, and {why}",
                                "use precision=bf16 or precision=fp32, or run where fp16 is supported"))
    if amp:
        if accel.name != "cuda" or accel.devices == 0:
            problems.append(Problem(AMP_KEY, f"Apex AMP needs a CUDA GPU, and ranks here would use "
                                    f"{where}" + (" with no GPU visible" if accel.name == "cuda" else ""),
                                    "use precision=bf16 or precision=fp32"))
        elif importlib.util.find_spec("apex") is None:
            problems.append(Problem(AMP_KEY, "Apex AMP needs NVIDIA apex, which is not installed",
                                    "install apex, or use precision=fp16/bf16"))
    if gds and accel.name != "cuda":  # DeepSpeed's parser asserts it, on every rank
        problems.append(Problem(GDS_KEY, f"GPUDirect Storage needs DeepSpeed's CUDA accelerator; ranks here would "
                                f"use {where}", "set it to false, or run on CUDA GPUs"))
    return problems
