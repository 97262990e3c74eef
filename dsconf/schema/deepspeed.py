"""The ``deepspeed`` node: the top level of DeepSpeed's JSON, keys and defaults as DeepSpeed has them.

The batch, optimizer, precision, ZeRO and logging keys are declared here; the other sections come from one
mixin per concern (monitoring, checkpointing, parallelism, runtime features, and the sections DeepSpeed 0.19.8
removed). Sections other than the core ones are null until written, so untouched ones cost composition nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsconf.schema._field import doc, hf_auto, section
from dsconf.schema.activation_checkpointing import ActivationCheckpointingConfig
from dsconf.schema.checkpointing import CheckpointingSections
from dsconf.schema.monitoring import MonitoringSections
from dsconf.schema.parallelism import ParallelismSections
from dsconf.schema.precision import BF16Config, FP16Config, TorchAutocastConfig
from dsconf.schema.removed import RemovedSections
from dsconf.schema.runtime import RuntimeSections
from dsconf.schema.zero import ZeroOptimizationConfig

# Batch keys resolve to the derived value unless the user gives one (an int, or "auto" to derive).
DERIVE_BATCH = "${dsconf.batch:}"
COMM_DTYPES = ["fp32", "fp16", "bf16"]
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]


@dataclass
class TrainingKeys:
    """The top-level keys of training itself: batch, optimizer, gradients, precision, ZeRO, logging."""

    train_batch_size: Any = doc(DERIVE_BATCH, "Samples per optimizer step: micro x accumulation x data-parallel")
    train_micro_batch_size_per_gpu: Any = doc(DERIVE_BATCH, "Samples per rank per forward/backward pass")
    gradient_accumulation_steps: Any = doc(DERIVE_BATCH, "Micro-batches accumulated before each optimizer step")
    managed_gradient_accumulation: bool = doc(
        True, "DeepSpeed steps on accumulation boundaries; false = every step() updates (the client decides)")
    optimizer: Any = doc(None, "Optimizer DeepSpeed builds: {type, params}; null = the one passed to initialize")
    scheduler: Any = doc(None, "Learning-rate schedule DeepSpeed builds: {type, params}; null = none")
    gradient_clipping: Any = hf_auto(1.0, "Clip gradients to this global norm; 0 = off",
                                     "gradient_clipping", float, ge=0)
    communication_data_type: Optional[str] = doc(None, "Dtype of gradient all-reduce; null = the training dtype",
                                                 choices=COMM_DTYPES, case_insensitive=True)
    seq_parallel_communication_data_type: Optional[str] = doc(
        "fp32", "Dtype of sequence-parallel gradient communication", choices=COMM_DTYPES, case_insensitive=True)
    prescale_gradients: bool = doc(False, "Scale gradients before all-reduce")
    gradient_predivide_factor: float = doc(1.0, "Divide gradients by this factor before averaging", gt=0)
    gradient_allreduce_op: str = doc("mean", "How gradients are combined across ranks", choices=["mean", "sum"],
                                     case_insensitive=True, since="0.19.8")
    disable_allgather: bool = doc(False, "Disable all-gather (legacy flag, read but unused by the engine)")
    fp32_allreduce: Optional[bool] = doc(None, "Deprecated (ignored since DeepSpeed 0.5.8)",
                                         legacy="communication_data_type")
    fp16: FP16Config = doc(FP16Config(), "fp16 mixed precision with loss scaling")
    bf16: BF16Config = doc(BF16Config(), "bfloat16 mixed precision")
    # Free-form so that only the keys the user wrote are translated into bf16 (checked as a BF16Config).
    bfloat16: Any = doc(None, "Deprecated name of bf16", legacy="bf16")
    torch_autocast: Any = section(TorchAutocastConfig, "torch.autocast mixed precision; null = off")
    zero_optimization: ZeroOptimizationConfig = doc(ZeroOptimizationConfig(), "ZeRO memory optimizations")
    zero_allow_untested_optimizer: bool = doc(False, "Allow ZeRO with optimizers DeepSpeed has not tested")
    zero_force_ds_cpu_optimizer: bool = doc(True, "Require DeepSpeed's CPU optimizer with optimizer offload")
    activation_checkpointing: Any = section(ActivationCheckpointingConfig,
                                            "Activation checkpointing settings; null = DeepSpeed's defaults")
    dataloader_drop_last: bool = doc(False, "Drop the last incomplete batch of DeepSpeed's data loader")
    disable_python_gc: bool = doc(False, "Turn off Python's automatic cyclic garbage collection", since="0.19.8")
    vocabulary_size: Optional[int] = doc(None, "Vocabulary size; DeepSpeed warns unless a multiple of 8")
    steps_per_print: Optional[int] = doc(None, "Log progress every N steps; null = never", ge=1)
    log_level: Optional[str] = doc(None, "Level of DeepSpeed's logger; null = unchanged", choices=LOG_LEVELS,
                                   case_insensitive=True)
    wall_clock_breakdown: bool = doc(False, "Time forward/backward/step phases")
    memory_breakdown: bool = doc(False, "Log memory use at each phase")
    dump_state: bool = doc(False, "Print DeepSpeed's state after initialisation")


# Dataclass fields are ordered base by base from the last base class to the first: the training keys come first,
# then monitoring, checkpointing, parallelism, runtime features, and the removed sections last.
@dataclass
class DeepSpeedConfig(RemovedSections, RuntimeSections, ParallelismSections, CheckpointingSections,
                      MonitoringSections, TrainingKeys):
    """Every top-level key DeepSpeed's ``DeepSpeedConfig`` reads, with DeepSpeed's names and defaults."""
