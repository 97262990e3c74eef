"""The ``deepspeed`` node: the top level of DeepSpeed's JSON, keys and defaults as DeepSpeed has them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsconf.schema._field import doc
from dsconf.schema.activation_checkpointing import ActivationCheckpointingConfig
from dsconf.schema.precision import AmpConfig, BF16Config, FP16Config, TorchAutocastConfig
from dsconf.schema.zero import ZeroOptimizationConfig

# Batch keys resolve to the derived value unless the user gives one (an int, or "auto" to derive).
DERIVE_BATCH = "${dsconf.batch:}"
COMM_DTYPES = ["fp32", "fp16", "bf16"]


@dataclass
class DeepSpeedConfig:
    train_batch_size: Any = doc(DERIVE_BATCH, "Samples per optimizer step: micro x accumulation x data-parallel")
    train_micro_batch_size_per_gpu: Any = doc(DERIVE_BATCH, "Samples per rank per forward/backward pass")
    gradient_accumulation_steps: Any = doc(DERIVE_BATCH, "Micro-batches accumulated before each optimizer step")
    optimizer: Any = doc(None, "Optimizer DeepSpeed builds: {type, params}; null = the one passed to initialize")
    scheduler: Any = doc(None, "Learning-rate schedule DeepSpeed builds: {type, params}; null = none")
    communication_data_type: Optional[str] = doc(None, "Dtype of gradient all-reduce; null = the training dtype",
                                                 choices=COMM_DTYPES, case_insensitive=True)
    prescale_gradients: bool = doc(False, "Scale gradients before all-reduce")
    gradient_predivide_factor: float = doc(1.0, "Divide gradients by this factor before averaging", gt=0)
    gradient_allreduce_op: str = doc("mean", "How gradients are combined across ranks", choices=["mean", "sum"],
                                     case_insensitive=True, since="0.19.8")
    sparse_gradients: Optional[bool] = doc(None, "Sparse all-reduce of torch.nn.Embedding gradients", until="0.19.8",
                                           instead="remove it; sparse=True embeddings are still reduced sparsely")
    fp32_allreduce: Optional[bool] = doc(None, "Deprecated (ignored since DeepSpeed 0.5.8)",
                                         legacy="communication_data_type")
    fp16: FP16Config = doc(FP16Config(), "fp16 mixed precision with loss scaling")
    bf16: BF16Config = doc(BF16Config(), "bfloat16 mixed precision")
    # Free-form so that only the keys the user wrote are translated into bf16 (checked as a BF16Config).
    bfloat16: Any = doc(None, "Deprecated name of bf16", legacy="bf16")
    amp: Optional[AmpConfig] = doc(None, "NVIDIA Apex AMP; null = off", until="0.19.8",
                                     instead="use precision=fp16, precision=bf16 or precision=torch_autocast")
    torch_autocast: Optional[TorchAutocastConfig] = doc(None, "torch.autocast mixed precision; null = off")
    gradient_clipping: float = doc(1.0, "Clip gradients to this global norm; 0 = off", ge=0)
    zero_optimization: ZeroOptimizationConfig = doc(ZeroOptimizationConfig(), "ZeRO memory optimizations")
    zero_allow_untested_optimizer: bool = doc(False, "Allow ZeRO with optimizers DeepSpeed has not tested")
    zero_force_ds_cpu_optimizer: bool = doc(True, "Require DeepSpeed's CPU optimizer with optimizer offload")
    steps_per_print: Optional[int] = doc(None, "Log progress every N steps; null = never", ge=1)
    wall_clock_breakdown: bool = doc(False, "Time forward/backward/step phases")
    dump_state: bool = doc(False, "Print DeepSpeed's state after initialisation")
    activation_checkpointing: Optional[ActivationCheckpointingConfig] = doc(
        None, "Activation checkpointing settings; null = DeepSpeed's defaults")
    sparse_attention: Any = doc(None, "Sparse attention layout {mode, ...}; null = off", until="0.19.8",
                            instead="use sparse_attention=none, or target an older DeepSpeed via deepspeed_version")
