"""The ``scheduler`` section: ``type`` plus ``params``, one params model per DeepSpeed LR schedule.

Parameter names and defaults are those of ``deepspeed/runtime/lr_schedules.py``; parameters without a
default there are required (``???``) here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from dsconf.schema._field import doc, hf_auto
from dsconf.schema.hf_sources import HF_SOURCES

WARMUP_TYPES = ["log", "linear"]
REQUIRED = "???"  # OmegaConf's mark for a value the user must set
# What HF Transformers' Trainer fills an "auto" param from, whatever the scheduler
HF_FILLED_PARAMS: Dict[str, str] = {key.split(".")[-1]: str(source) for key, source in HF_SOURCES.items()
                                    if key.startswith("scheduler.params.")}


@dataclass
class WarmupLRParams:
    warmup_min_lr: Any = hf_auto(0.0, "Learning rate at the start of warm-up", "scheduler.params.warmup_min_lr", float,
                                 ge=0)
    warmup_max_lr: Any = hf_auto(None, "Learning rate at the end of warm-up; null = the optimizer's lr",
                                 "scheduler.params.warmup_max_lr", Optional[float], ge=0)
    warmup_num_steps: Any = hf_auto(1000, "Warm-up steps", "scheduler.params.warmup_num_steps", int, gt=0)
    warmup_type: str = doc("log", "Warm-up curve", choices=WARMUP_TYPES)
    last_batch_iteration: int = doc(-1, "Last step when resuming; -1 starts fresh")


@dataclass
class WarmupDecayLRParams(WarmupLRParams):
    """WarmupLR followed by a linear decay to 0 at ``total_num_steps`` (a subclass in DeepSpeed too)."""

    total_num_steps: Any = hf_auto(REQUIRED, "Total training steps (decay reaches 0 there)",
                                   "scheduler.params.total_num_steps", int, gt=0)
    warmup_max_lr: Any = hf_auto(0.001, "Learning rate at the end of warm-up", "scheduler.params.warmup_max_lr", float,
                                 ge=0)


@dataclass
class WarmupCosineLRParams:
    total_num_steps: Any = hf_auto(REQUIRED, "Total training steps", "scheduler.params.total_num_steps", int, gt=0)
    warmup_min_ratio: float = doc(0.0, "Start of warm-up as a fraction of the optimizer's lr", ge=0)
    warmup_num_steps: Any = hf_auto(1000, "Warm-up steps", "scheduler.params.warmup_num_steps", int, gt=0)
    cos_min_ratio: float = doc(0.0001, "End of cosine decay as a fraction of the optimizer's lr", ge=0)
    warmup_type: str = doc("log", "Warm-up curve", choices=WARMUP_TYPES)
    last_batch_iteration: int = doc(-1, "Last step when resuming; -1 starts fresh")


@dataclass
class OneCycleParams:
    cycle_min_lr: float = doc(REQUIRED, "Lowest learning rate of the cycle", ge=0)
    cycle_max_lr: float = doc(REQUIRED, "Highest learning rate of the cycle", ge=0)
    decay_lr_rate: float = doc(0.0, "Learning-rate decay after the cycle", ge=0)
    cycle_first_step_size: int = doc(2000, "Steps of the first half of the cycle", gt=0)
    cycle_second_step_size: Optional[int] = doc(None, "Steps of the second half; null = first half's", gt=0)
    cycle_first_stair_count: int = doc(0, "Stairs in the first half", ge=0)
    cycle_second_stair_count: Optional[int] = doc(None, "Stairs in the second half", ge=0)
    decay_step_size: int = doc(0, "Steps between decays after the cycle", ge=0)
    cycle_momentum: bool = doc(True, "Cycle momentum inversely to the learning rate")
    cycle_min_mom: float = doc(0.8, "Lowest momentum", ge=0)
    cycle_max_mom: float = doc(0.9, "Highest momentum", ge=0)
    decay_mom_rate: float = doc(0.0, "Momentum decay after the cycle", ge=0)
    last_batch_iteration: int = doc(-1, "Last step when resuming; -1 starts fresh")


@dataclass
class LRRangeTestParams:
    lr_range_test_min_lr: float = doc(1e-3, "Starting learning rate", ge=0)
    lr_range_test_step_size: int = doc(2000, "Steps between increases", gt=0)
    lr_range_test_step_rate: float = doc(1.0, "Increase rate", gt=0)
    lr_range_test_staircase: bool = doc(False, "Increase in steps instead of continuously")
    last_batch_iteration: int = doc(-1, "Last step when resuming; -1 starts fresh")


# DeepSpeed matches scheduler names exactly (case-sensitive).
SCHEDULERS: Dict[str, type] = {
    "WarmupLR": WarmupLRParams,
    "WarmupDecayLR": WarmupDecayLRParams,
    "WarmupCosineLR": WarmupCosineLRParams,
    "OneCycle": OneCycleParams,
    "LRRangeTest": LRRangeTestParams,
}


@dataclass
class SchedulerConfig:
    type: str = doc("WarmupLR", "Scheduler name", choices=list(SCHEDULERS))
    params: Any = doc(None, "Keyword arguments of the scheduler's constructor", model_key="type",
                      models=SCHEDULERS.get)


def scheduler_preset(type_name: str) -> SchedulerConfig:
    return SchedulerConfig(type=type_name, params=SCHEDULERS[type_name]())
