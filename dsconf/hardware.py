"""What the machine a job is about to run on can do: precisions that need a GPU are refused before launch.

Composing and validating stay hardware-agnostic (a config for a GPU cluster can be checked on a laptop);
this check runs only where ranks are about to start.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, List

from dsconf.errors import Problem
from dsconf.world import visible_gpu_count


def hardware_problems(ds: Dict[str, Any], *, gpus: int = -1) -> List[Problem]:
    """Problems running ``ds`` (an exported DeepSpeed dict) here; ``gpus`` defaults to the visible GPUs."""
    gpus = visible_gpu_count() if gpus < 0 else gpus
    problems = []
    # `is True`: with keep_auto, "auto" is HF's to decide
    if (ds.get("fp16") or {}).get("enabled") is True and gpus == 0:
        problems.append(Problem("deepspeed.fp16.enabled", "fp16 training needs a CUDA GPU and none is visible here",
                                "use precision=bf16 or precision=fp32 on CPU"))
    if (ds.get("amp") or {}).get("enabled") is True:
        if gpus == 0:
            problems.append(Problem("deepspeed.amp.enabled", "Apex AMP needs a CUDA GPU and none is visible here",
                                    "use precision=bf16 or precision=fp32 on CPU"))
        elif importlib.util.find_spec("apex") is None:
            problems.append(Problem("deepspeed.amp.enabled", "Apex AMP needs NVIDIA apex, which is not installed",
                                    "install apex, or use precision=fp16/bf16"))
    return problems
