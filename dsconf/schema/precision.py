"""Precision sections: ``fp16``, ``bf16`` (legacy ``bfloat16``), ``amp`` (removed in DeepSpeed 0.19.8) and
``torch_autocast``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, List, Optional

from dsconf.schema._field import doc, hf_auto


@dataclass
class FP16Config:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.precision_config.DeepSpeedFP16Config"

    enabled: Any = hf_auto(False, "Train in fp16 mixed precision (needs a GPU)",
                           "fp16.enabled", bool)
    auto_cast: bool = doc(False, "Cast inputs to fp16 automatically")
    loss_scale: float = doc(0.0, "Static loss scale; 0 means dynamic loss scaling", ge=0, finite=True)
    initial_scale_power: int = doc(16, "Dynamic loss scaling starts at 2**initial_scale_power")
    loss_scale_window: int = doc(1000, "Steps between raising/lowering the dynamic loss scale", finite=True)
    hysteresis: int = doc(2, "Delay shift in dynamic loss scaling")
    consecutive_hysteresis: bool = doc(False, "Refill hysteresis when a step does not overflow")
    min_loss_scale: int = doc(1, "Lowest dynamic loss scale", finite=True)
    fp16_master_weights_and_grads: bool = doc(False, "Keep master weights and grads in fp16 (ZeRO 1-3 only)")


@dataclass
class BF16Config:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.precision_config.DeepSpeedBF16Config"

    enabled: Any = hf_auto(False, "Train in bfloat16 mixed precision", "bf16.enabled", bool)
    immediate_grad_update: bool = doc(False, "Apply gradient updates immediately rather than delayed")
    check_grad_overflow: bool = doc(True, "Skip the optimizer step when gradients overflow")
    bf16_master_weights_and_grads: bool = doc(False, "Keep master weights and grads in bf16 (ZeRO 1-3 only)")
    bf16_optimizer_states: bool = doc(False, "Keep optimizer states in bf16 (needs bf16_master_weights_and_grads)")


@dataclass
class AmpConfig:
    """NVIDIA Apex AMP; everything but ``enabled`` is passed to ``apex.amp.initialize``."""

    enabled: Any = hf_auto(True, "Train with Apex AMP (needs a GPU and apex)",
                           "amp.enabled", bool)
    opt_level: Any = hf_auto("O1", "Apex optimisation level", "amp.opt_level", Optional[str],
                             choices=["O0", "O1", "O2", "O3"])
    cast_model_type: Optional[str] = doc(None, "Apex: dtype to cast the model to")
    patch_torch_functions: Optional[bool] = doc(None, "Apex: patch torch functions to run in fp16")
    keep_batchnorm_fp32: Optional[bool] = doc(None, "Apex: keep batchnorm weights in fp32")
    master_weights: Optional[bool] = doc(None, "Apex: keep fp32 master weights")
    loss_scale: Optional[str] = doc(None, "Apex: 'dynamic' or a number as a string")
    cast_model_outputs: Optional[str] = doc(None, "Apex: dtype to cast model outputs to")
    num_losses: Optional[int] = doc(None, "Apex: number of losses scaled separately", ge=1)
    verbosity: Optional[int] = doc(None, "Apex: log verbosity", ge=0)
    min_loss_scale: Optional[float] = doc(None, "Apex: lowest dynamic loss scale", gt=0)
    max_loss_scale: Optional[float] = doc(None, "Apex: highest dynamic loss scale", gt=0)


@dataclass
class TorchAutocastConfig:
    enabled: bool = doc(True, "Run forward passes under torch.autocast")
    dtype: Optional[str] = doc("bfloat16", "Autocast dtype",
                               choices=["bfloat16", "bf16", "float16", "fp16", "half", "torch.bfloat16",
                                        "torch.float16"])
    lower_precision_safe_modules: Optional[List[str]] = doc(
        None, "Module classes (full import paths) whose parameters may be kept in lower precision")
