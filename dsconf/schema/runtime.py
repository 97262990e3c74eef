"""Runtime features that fit no other module: DeepCompile ``compile``, ZeRO-3 ``weight_quantization``, and the
top-level ``data_efficiency`` and ``autotuning`` sections (modelled in their own modules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional

from dsconf.schema._field import doc, section
from dsconf.schema.autotuning import AutotuningConfig
from dsconf.schema.data_efficiency import DataEfficiencyConfig

COMPILE_PASSES = ["z1", "z3", "autosp", "autotp"]


@dataclass
class CompileConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.compile.config.CompileConfig"

    deepcompile: bool = doc(False, "Compile the training step with DeepCompile (ZeRO-aware torch.compile passes)")
    autoep_non_moe: bool = doc(False, "engine.compile(): compile AutoEP layers' parents, keep AutoEP eager",
                               since="0.19.8")
    free_activation: bool = doc(False, "Free activations eagerly")
    free_activation_threshold: int = doc(10 * 1024 * 1024, "Bytes from which activations are freed eagerly")
    offload_activation: bool = doc(False, "Offload saved activations to pinned host memory")
    offload_activation_pin_memory: bool = doc(True, "Pin the host buffers of activation offload", since="0.19.8")
    offload_opt_states: bool = doc(False, "Offload optimizer states to host between optimizer steps")
    double_buffer: bool = doc(True, "Double-buffer parameter fetches")
    symmetric_memory: bool = doc(False, "Use symmetric memory for collectives")
    debug_log: bool = doc(False, "Dump the compiled graphs")
    offload_parameters: bool = doc(False, "Offload parameters")
    sync_before_reduce: bool = doc(False, "Synchronise before each reduce")
    sync_after_reduce: bool = doc(False, "Synchronise after each reduce")
    sync_before_allgather: bool = doc(False, "Synchronise before each all-gather")
    sync_after_allgather: bool = doc(False, "Synchronise after each all-gather")
    keep_int_input_tensors: bool = doc(True, "Keep real values of integer inputs while profiling (not dummies)")
    keep_all_input_tensors: bool = doc(False, "Keep real values of all inputs while profiling (not dummies)")
    passes: Optional[List[str]] = doc(None, "Optimisation passes to compose: z1, z3, autosp, autotp (0.19.8)")


@dataclass
class WeightQuantizationConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.inference.config.WeightQuantConfig"

    enabled: bool = doc(True, "Quantize weights")
    num_bits: int = doc(8, "Bits per quantized weight")
    q_type: str = doc("symmetric", "Quantization type", choices=["symmetric", "asymmetric"])
    q_groups: int = doc(1, "Quantization groups")
    quantized_initialization: Dict[str, Any] = doc(
        {}, "Quantize weights as ZeRO-3 partitions them: {num_bits, group_size, group_dim, symmetric}")
    post_init_quant: Dict[str, Any] = doc({}, "Module name pattern -> quantization settings, applied after init")


@dataclass
class RuntimeSections:
    compile: Any = section(CompileConfig, "DeepCompile settings; null = DeepSpeed's defaults (off)")
    weight_quantization: Any = section(WeightQuantizationConfig, "Weight quantization (ZeRO-3 init); null = off")
    data_efficiency: Any = section(DataEfficiencyConfig, "Data efficiency: curriculum sampling and random-LTD")
    autotuning: Any = section(AutotuningConfig, "Autotuner settings (deepspeed --autotuning); null = defaults")
