"""The ``zero_optimization`` section: offload blocks, ZenFlow, leaf modules and the keys DeepSpeed 0.19.8 removed,
keys as in DeepSpeed's JSON."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, ClassVar, List, Optional, Union

from dsconf.schema._field import doc, hf_auto, section

OFFLOAD_DEVICES = ["none", "cpu", "nvme"]
OFFLOAD_BLOCKS = ("offload_optimizer", "offload_param")
REMOVED_IN = "0.19.8"
MICS_REMOVED = "MiCS ZeRO-3 sharding was removed: remove it"
# DeepSpeed's default ZeRO-3 leaf modules (deepspeed.runtime.zero.leaf_module_config).
DEFAULT_LEAF_MODULE_CLASSES = [
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
]


@dataclass
class OffloadParamConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig"

    device: Any = hf_auto("none", "Where to offload parameters (ZeRO stage 3 only)",
                          "zero_optimization.offload_param.device", str, choices=OFFLOAD_DEVICES)
    nvme_path: Any = hf_auto(None, "NVMe directory for device=nvme", "zero_optimization.offload_param.nvme_path",
                             Optional[str])
    buffer_count: int = doc(5, "Buffers in the parameter swap pool", ge=0)
    buffer_size: int = doc(100_000_000, "Size of each parameter swap buffer (elements)", ge=0)
    max_in_cpu: int = doc(1_000_000_000, "Parameter elements kept in CPU memory with NVMe offload", ge=0)
    pin_memory: bool = doc(True, "Offload to page-locked CPU memory")


@dataclass
class OffloadOptimizerConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig"

    device: Any = hf_auto("none", "Where to offload optimizer state and computation",
                          "zero_optimization.offload_optimizer.device", str, choices=OFFLOAD_DEVICES)
    nvme_path: Any = hf_auto(None, "NVMe directory for device=nvme", "zero_optimization.offload_optimizer.nvme_path",
                             Optional[str])
    buffer_count: int = doc(4, "Buffers in the optimizer-state swap pool", ge=0)
    pin_memory: bool = doc(True, "Offload to page-locked CPU memory")
    pipeline_read: bool = doc(False, "Overlap NVMe reads of optimizer state with computation")
    pipeline_write: bool = doc(False, "Overlap NVMe writes of optimizer state with computation")
    fast_init: bool = doc(False, "Fast optimizer initialisation for NVMe offload")
    ratio: float = doc(1.0, "Fraction of optimizer state offloaded (< 1 needs stage 3)", ge=0, le=1)
    super_offload: bool = doc(False, "Use SuperOffload (CPU optimizer step overlapped with GPU work)")
    cpuadam_cores_perc: float = doc(0.8, "Share of CPU cores the CPU optimizer may use", ge=0, le=1)


@dataclass
class ZenFlowConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.zenflow.zenflow_config.ZenFlowConfig"

    topk_ratio: float = doc(0.1, "Share of important gradient columns updated every step (0 < ratio < 1)", gt=0, le=1)
    select_strategy: str = doc("auto", "When important columns are reselected", choices=["auto", "step", "epoch"])
    select_interval: Any = doc("auto", "Reselect every N steps/epochs, or 'auto'", type=Union[str, int],
                               choices=["auto"])
    update_interval: Any = doc("auto", "Apply accumulated unimportant gradients every N steps, or 'auto'",
                               type=Union[str, int], choices=["auto"], ge=1)
    overlap_step: bool = doc(False, "Overlap the CPU optimizer step with forward/backward")
    offload: bool = doc(False, "Offload selective optimizer states to CPU")
    auto_ratio: float = doc(0.99, "Threshold of the 'auto' update interval", ge=0, le=1)
    full_warm_up_rounds: int = doc(0, "Initial rounds that update all gradients")
    pt_reserved_cores_perc: float = doc(0.5, "Share of CPU cores kept for PyTorch threads", ge=0, le=1)


@dataclass
class LeafModuleConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.zero.leaf_module_config.DeepSpeedZeroLeafModuleConfig"

    classes: List[str] = doc(DEFAULT_LEAF_MODULE_CLASSES, "Module classes (import paths) fetched as one unit")
    names: List[str] = doc([], "Module names fetched as one unit")
    name_suffixes: List[str] = doc([], "Module name suffixes fetched as one unit")


@dataclass
class LocoParamConfig:
    err_beta: float = doc(0.8, "Moving-average coefficient of the quantization error", ge=0, le=1)
    reset_T: int = doc(1024, "Steps after which the error buffer is cleared")


@dataclass
class ZeroOptimizationConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.zero.config.DeepSpeedZeroConfig"

    stage: Any = hf_auto(0, "ZeRO stage: 0 off, 1 optimizer states, 2 +gradients, 3 +parameters",
                         "zero_optimization.stage", int, choices=[0, 1, 2, 3])
    contiguous_gradients: bool = doc(True, "Copy gradients into a contiguous buffer as they are produced")
    reduce_scatter: bool = doc(True, "Average gradients with reduce/reduce-scatter instead of all-reduce")
    reduce_bucket_size: Any = hf_auto(500_000_000, "Elements reduced at a time",
                                      "zero_optimization.reduce_bucket_size", int, gt=0)
    use_multi_rank_bucket_allreduce: bool = doc(True, "Combine ranks' reduce buckets into one all-reduce")
    allgather_partitions: bool = doc(True, "All-gather updated partitions (else a series of broadcasts)")
    allgather_bucket_size: int = doc(500_000_000, "Elements all-gathered at a time", ge=0)
    overlap_comm: Optional[bool] = doc(None, "Overlap gradient reduction with backward; null = true only for stage 3")
    compute_grad_norm: bool = doc(True, "Compute the global gradient norm in stage 1/2 steps", since="0.19.8")
    load_from_fp32_weights: bool = doc(True, "Initialise fp32 master weights from the checkpoint's fp32 copies")
    elastic_checkpoint: bool = doc(False, "Legacy elastic checkpoint support")
    # Present (device "none") rather than null so a dotted override can reach their keys; export leaves a
    # block out while its device is "none", which is what DeepSpeed does with it.
    offload_param: Optional[OffloadParamConfig] = doc(OffloadParamConfig(), "Offload parameters to CPU/NVMe (stage 3)")
    offload_optimizer: Optional[OffloadOptimizerConfig] = doc(OffloadOptimizerConfig(),
                                                              "Offload optimizer state to CPU/NVMe")
    zenflow: Any = section(ZenFlowConfig, "ZenFlow: important gradients updated on GPU, the rest later on CPU; "
                           "null = off")
    sub_group_size: int = doc(1_000_000_000, "Tile size for parameter processing (ZeRO-Offload/Infinity)", ge=0)
    cpu_offload: Optional[bool] = doc(None, "Deprecated: true means offload_optimizer.device=cpu",
                                      legacy="offload_optimizer")
    cpu_offload_param: Optional[bool] = doc(None, "Deprecated: true means offload_param.device=cpu",
                                            legacy="offload_param")
    cpu_offload_use_pin_memory: Optional[bool] = doc(None, "Deprecated: use offload_*.pin_memory",
                                                     legacy="offload_optimizer.pin_memory")
    stage3_prefetch_bucket_size: Any = hf_auto(50_000_000, "Parameter elements fetched ahead of use (stage 3)",
                                               "zero_optimization.stage3_prefetch_bucket_size", int, ge=0,
                                               aliases=("prefetch_bucket_size",))
    stage3_param_persistence_threshold: Any = hf_auto(100_000, "Parameters smaller than this stay unpartitioned",
                                                      "zero_optimization.stage3_param_persistence_threshold", int, ge=0,
                                                      aliases=("param_persistence_threshold",))
    stage3_model_persistence_threshold: int = doc(sys.maxsize, "Cap on unpartitioned parameter elements", ge=0,
                                                  aliases=("model_persistence_threshold",))
    stage3_max_live_parameters: int = doc(1_000_000_000, "Parameters resident per GPU before release", ge=0,
                                          aliases=("max_live_parameters",))
    stage3_max_reuse_distance: int = doc(1_000_000_000, "Keep a parameter reused within this many elements", ge=0,
                                         aliases=("max_reuse_distance",))
    stage3_gather_16bit_weights_on_model_save: Any = hf_auto(
        False, "Gather 16-bit weights in save_16bit_model()",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save", bool,
        aliases=("gather_16bit_weights_on_model_save",))
    stage3_module_granularity_threshold: int = doc(0, "Modules finer than this are fetched as one unit",
                                                   aliases=("module_granularity_threshold",))
    stage3_use_all_reduce_for_fetch_params: bool = doc(False, "Fetch parameters with all-reduce (stage 3)",
                                                       aliases=("use_all_reduce_for_fetch_params",))
    stage3_allgather_sequential: bool = doc(False, "All-gather parameters one by one, without buckets (stage 3)",
                                            aliases=("allgather_sequential",))
    stage3_gather_fp16_weights_on_model_save: Optional[bool] = doc(
        None, "Deprecated name of stage3_gather_16bit_weights_on_model_save",
        legacy="stage3_gather_16bit_weights_on_model_save")
    ignore_unused_parameters: bool = doc(True, "Tolerate parameters that get no gradient (stage 2)")
    legacy_stage1: bool = doc(False, "Use the old ZeRO stage 1 implementation")
    round_robin_gradients: bool = doc(False, "Parallelise gradient copies to CPU among ranks (stage 1/2 offload)")
    parameter_alignment: bool = doc(False, "Pad stage 1/2 flat buffers to 16-byte aligned parameters",
                                    since="0.19.8")
    zero_hpz_partition_size: int = doc(1, "Ranks in ZeRO++ hierarchical partitioning group", ge=0)
    zero_quantized_weights: bool = doc(False, "ZeRO++: quantise weights for all-gather")
    zero_quantized_nontrainable_weights: bool = doc(False, "ZeRO++: store non-trainable weights quantised")
    zero_quantized_gradients: bool = doc(False, "ZeRO++: quantise gradients for reduce")
    zeropp_loco_param: Any = section(LocoParamConfig, "LoCo error feedback for ZeRO++ quantized gradients; null = off",
                                     until=REMOVED_IN, instead="LoCo-Zero++ was removed: remove it (standard ZeRO++ "
                                                               "quantized gradients remain)")
    mics_shard_size: Optional[int] = doc(None, "MiCS: ranks per parameter shard; null = off (DeepSpeed's -1)",
                                         until=REMOVED_IN, instead=MICS_REMOVED)
    mics_hierarchical_params_gather: Optional[bool] = doc(None, "MiCS: hierarchical all-gather; null = off (false)",
                                                          until=REMOVED_IN, instead=MICS_REMOVED)
    memory_efficient_linear: bool = doc(True, "Memory-efficient linear layer (stage 3)")
    pipeline_loading_checkpoint: bool = doc(False, "Force pipeline-mode checkpoint loading (stage 3)")
    override_module_apply: bool = doc(True, "Override nn.Module.apply (stage 3)")
    log_trace_cache_warnings: bool = doc(False, "Log trace-cache invalidation warnings (stage 3)")
    enable_sanity_checks: bool = doc(False, "Enable internal sanity checks (debugging)")
    save_muon_momentum_buffer_in_memory: bool = doc(False, "Keep Muon momentum in memory with NVMe offload")
    leaf_module: Any = section(LeafModuleConfig, "ZeRO-3 leaf modules (fetched whole, no inner hooks); "
                               "null = DeepSpeed's (HF MoE blocks)")
