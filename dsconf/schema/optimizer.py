"""The ``optimizer`` section: ``type`` plus ``params``, one params model per optimizer DeepSpeed builds.

Names are matched as DeepSpeed matches them: its own optimizers case-insensitively, anything else as a
``torch.optim`` class name (case-sensitive), whose params are checked against the class signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from dsconf.schema._field import doc, hf_auto
from dsconf.schema.hf_sources import HF_SOURCES

BETAS = [0.9, 0.999]
# What HF Transformers' Trainer fills an "auto" param from, whatever the optimizer (one without a params model too)
HF_FILLED_PARAMS: Dict[str, str] = {key.split(".")[-1]: str(source) for key, source in HF_SOURCES.items()
                                    if key.startswith("optimizer.params.")}


@dataclass
class AdamParams:
    lr: Any = hf_auto(1e-3, "Learning rate", "optimizer.params.lr", float, ge=0)
    betas: Any = hf_auto(BETAS, "Coefficients for running averages of the gradient and its square",
                         "optimizer.params.betas", List[float])
    eps: Any = hf_auto(1e-8, "Term added to the denominator for numerical stability", "optimizer.params.eps", float,
                       ge=0)
    weight_decay: Any = hf_auto(0.0, "Weight decay", "optimizer.params.weight_decay", float, ge=0)
    # not filled in: DeepSpeed hands every other param to torch.optim.Adam(W) when torch_adam is true, and torch's Adam
    # has no such argument (a TypeError in deepspeed.initialize)
    bias_correction: Optional[bool] = doc(None, "Adam's bias correction; null: the optimizer's own (on; "
                                                "torch_adam's Adam has no such argument)")
    adam_w_mode: bool = doc(True, "Decoupled weight decay; DeepSpeed's 'Adam' is AdamW unless this is false")
    torch_adam: bool = doc(False, "Use torch.optim's implementation instead of DeepSpeed's fused one")


@dataclass
class _MomentParams:
    """Keys shared by DeepSpeed's Lamb and 1-bit optimizers (their constructors' common arguments)."""

    lr: Any = hf_auto(1e-3, "Learning rate", "optimizer.params.lr", float, ge=0)
    betas: Any = hf_auto(BETAS, "Coefficients for running averages", "optimizer.params.betas", List[float])
    eps: Any = hf_auto(1e-8, "Numerical stability term", "optimizer.params.eps", float, ge=0)
    eps_inside_sqrt: bool = doc(False, "Add eps inside the square root")
    weight_decay: Any = hf_auto(0.0, "Weight decay", "optimizer.params.weight_decay", float, ge=0)
    bias_correction: bool = doc(True, "Apply bias correction")


@dataclass
class LambParams(_MomentParams):
    max_coeff: float = doc(10.0, "Upper bound of the LAMB trust ratio")
    min_coeff: float = doc(0.01, "Lower bound of the LAMB trust ratio")


@dataclass
class _CompressedParams(_MomentParams):
    cuda_aware: bool = doc(False, "Use CUDA-aware MPI for communication")
    comm_backend_name: str = doc("nccl", "Communication backend for compressed all-reduce",
                                 choices=["nccl", "mpi", "hccl", "compressed"])


@dataclass
class OneBitAdamParams(_CompressedParams):
    freeze_step: int = doc(100000, "Warm-up steps before 1-bit compression starts", ge=0)


@dataclass
class ZeroOneAdamParams(_CompressedParams):
    var_freeze_step: int = doc(100000, "Step after which the variance is frozen", ge=0)
    var_update_scaler: int = doc(16, "Interval between variance updates", ge=1)
    local_step_scaler: int = doc(32678, "Interval scaler for local steps", ge=1)
    local_step_clipper: int = doc(16, "Upper bound of the local step interval", ge=1)


@dataclass
class OneBitLambParams(_CompressedParams):
    freeze_step: int = doc(100000, "Warm-up steps before 1-bit compression starts", ge=0)
    max_coeff: float = doc(10.0, "Upper bound of the trust ratio")
    min_coeff: float = doc(0.01, "Lower bound of the trust ratio")
    coeff_beta: float = doc(0.9, "Coefficient for the moving average of the trust ratio")
    factor_max: float = doc(4.0, "Upper bound of the scaling factor")
    factor_min: float = doc(0.5, "Lower bound of the scaling factor")
    factor_threshold: float = doc(0.1, "Threshold of the scaling factor's change")


@dataclass
class LionParams:
    lr: Any = hf_auto(1e-3, "Learning rate", "optimizer.params.lr", float, ge=0)
    betas: Any = hf_auto(BETAS, "Coefficients for the update and the momentum", "optimizer.params.betas", List[float])
    weight_decay: Any = hf_auto(0.0, "Weight decay", "optimizer.params.weight_decay", float, ge=0)


@dataclass
class AdagradParams:
    lr: Any = hf_auto(1e-2, "Learning rate", "optimizer.params.lr", float, ge=0)
    eps: Any = hf_auto(1e-10, "Numerical stability term", "optimizer.params.eps", float, ge=0)
    weight_decay: Any = hf_auto(0.0, "Weight decay", "optimizer.params.weight_decay", float, ge=0)


@dataclass
class SGDParams:
    lr: Any = hf_auto(1e-3, "Learning rate", "optimizer.params.lr", float, ge=0)
    momentum: float = doc(0.0, "Momentum factor", ge=0)
    dampening: float = doc(0.0, "Dampening for momentum", ge=0)
    weight_decay: Any = hf_auto(0.0, "Weight decay", "optimizer.params.weight_decay", float, ge=0)
    nesterov: bool = doc(False, "Nesterov momentum")


@dataclass(frozen=True)
class OptimizerSpec:
    """What dsconf knows of one optimizer DeepSpeed builds itself."""

    type: str
    params: Optional[type]
    until: Optional[str] = None  # first DeepSpeed version that no longer has it
    one_bit: bool = False  # 1-bit optimizers compress communication and refuse ZeRO
    needs_dynamic_loss_scale: bool = False  # with fp16, static loss scaling breaks them
    zero_tested: bool = False  # DeepSpeed runs ZeRO with it without zero_allow_untested_optimizer


# DeepSpeed's own optimizers, keyed by lower-cased name (DeepSpeed matches them case-insensitively).
DEEPSPEED_OPTIMIZERS: Dict[str, OptimizerSpec] = {
    spec.type.lower(): spec
    for spec in (
        OptimizerSpec("Adam", AdamParams, zero_tested=True),
        OptimizerSpec("AdamW", AdamParams, zero_tested=True),
        OptimizerSpec("Adagrad", AdagradParams, zero_tested=True),
        OptimizerSpec("Lamb", LambParams, needs_dynamic_loss_scale=True),
        OptimizerSpec("Lion", LionParams, zero_tested=True),
        OptimizerSpec("OneBitAdam", OneBitAdamParams, until="0.19.8", one_bit=True),
        OptimizerSpec("ZeroOneAdam", ZeroOneAdamParams, until="0.19.8", one_bit=True),
        OptimizerSpec("OneBitLamb", OneBitLambParams, until="0.19.8", one_bit=True, needs_dynamic_loss_scale=True),
        OptimizerSpec("MuAdam", None),
        OptimizerSpec("MuAdamW", None),
        OptimizerSpec("MuSGD", None),
        OptimizerSpec("Muon", None, zero_tested=True),
    )
}

# torch.optim classes dsconf ships a typed preset for; any other torch.optim class is checked against
# its constructor signature.
TORCH_OPTIMIZER_PARAMS: Dict[str, type] = {"SGD": SGDParams}


def optimizer_params_model(type_name: Any) -> Optional[type]:
    """The params model of the optimizer ``type_name`` names, matched as DeepSpeed matches it (None: no model)."""
    spec = DEEPSPEED_OPTIMIZERS.get(str(type_name).lower())
    if spec is not None:
        return spec.params
    return TORCH_OPTIMIZER_PARAMS.get(str(type_name))


@dataclass
class OptimizerConfig:
    type: str = doc("Adam", "Optimizer name: a DeepSpeed optimizer (any case) or a torch.optim class")
    params: Any = doc(None, "Keyword arguments of the optimizer's constructor", model_key="type",
                      models=optimizer_params_model)
    legacy_fusion: bool = doc(False, "Use the legacy fused fp16 optimizer path")


def optimizer_preset(type_name: str, params_cls: type) -> OptimizerConfig:
    return OptimizerConfig(type=type_name, params=params_cls())
