"""The ``zero_optimization`` section and its offload blocks, keys as in DeepSpeed's JSON."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

from dsconf.schema._field import doc

OFFLOAD_DEVICES = ["none", "cpu", "nvme"]
OFFLOAD_BLOCKS = ("offload_optimizer", "offload_param")


@dataclass
class OffloadParamConfig:
    device: str = doc("none", "Where to offload parameters (ZeRO stage 3 only)", choices=OFFLOAD_DEVICES)
    nvme_path: Optional[str] = doc(None, "NVMe directory for device=nvme")
    buffer_count: int = doc(5, "Buffers in the parameter swap pool", ge=0)
    buffer_size: int = doc(100_000_000, "Size of each parameter swap buffer (elements)", ge=0)
    max_in_cpu: int = doc(1_000_000_000, "Parameter elements kept in CPU memory with NVMe offload", ge=0)
    pin_memory: bool = doc(True, "Offload to page-locked CPU memory")


@dataclass
class OffloadOptimizerConfig:
    device: str = doc("none", "Where to offload optimizer state and computation", choices=OFFLOAD_DEVICES)
    nvme_path: Optional[str] = doc(None, "NVMe directory for device=nvme")
    buffer_count: int = doc(4, "Buffers in the optimizer-state swap pool", ge=0)
    pin_memory: bool = doc(True, "Offload to page-locked CPU memory")
    pipeline_read: bool = doc(False, "Overlap NVMe reads of optimizer state with computation")
    pipeline_write: bool = doc(False, "Overlap NVMe writes of optimizer state with computation")
    fast_init: bool = doc(False, "Fast optimizer initialisation for NVMe offload")
    ratio: float = doc(1.0, "Fraction of optimizer state offloaded (< 1 needs stage 3)", ge=0, le=1)
    super_offload: bool = doc(False, "Use SuperOffload (CPU optimizer step overlapped with GPU work)")
    cpuadam_cores_perc: float = doc(0.8, "Share of CPU cores the CPU optimizer may use", ge=0, le=1)


@dataclass
class ZeroOptimizationConfig:
    stage: int = doc(0, "ZeRO stage: 0 off, 1 optimizer states, 2 +gradients, 3 +parameters", choices=[0, 1, 2, 3])
    contiguous_gradients: bool = doc(True, "Copy gradients into a contiguous buffer as they are produced")
    reduce_scatter: bool = doc(True, "Average gradients with reduce/reduce-scatter instead of all-reduce")
    reduce_bucket_size: int = doc(500_000_000, "Elements reduced at a time", gt=0)
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
    sub_group_size: int = doc(1_000_000_000, "Tile size for parameter processing (ZeRO-Offload/Infinity)", ge=0)
    cpu_offload: Optional[bool] = doc(None, "Deprecated: true means offload_optimizer.device=cpu",
                                      legacy="offload_optimizer")
    cpu_offload_param: Optional[bool] = doc(None, "Deprecated: true means offload_param.device=cpu",
                                            legacy="offload_param")
    cpu_offload_use_pin_memory: Optional[bool] = doc(None, "Deprecated: use offload_*.pin_memory",
                                                     legacy="offload_optimizer.pin_memory")
    stage3_prefetch_bucket_size: int = doc(50_000_000, "Parameter elements fetched ahead of use (stage 3)", ge=0)
    stage3_param_persistence_threshold: int = doc(100_000, "Parameters smaller than this stay unpartitioned", ge=0)
    stage3_model_persistence_threshold: int = doc(sys.maxsize, "Cap on unpartitioned parameter elements", ge=0)
    stage3_max_live_parameters: int = doc(1_000_000_000, "Parameters resident per GPU before release", ge=0)
    stage3_max_reuse_distance: int = doc(1_000_000_000, "Keep a parameter reused within this many elements", ge=0)
    stage3_gather_16bit_weights_on_model_save: bool = doc(False, "Gather 16-bit weights in save_16bit_model()")
    stage3_module_granularity_threshold: int = doc(0, "Modules finer than this are fetched as one unit")
    stage3_use_all_reduce_for_fetch_params: bool = doc(False, "Fetch parameters with all-reduce (stage 3)")
    stage3_allgather_sequential: bool = doc(False, "All-gather parameters one by one, without buckets (stage 3)")
    ignore_unused_parameters: bool = doc(True, "Tolerate parameters that get no gradient (stage 2)")
    legacy_stage1: bool = doc(False, "Use the old ZeRO stage 1 implementation")
    round_robin_gradients: bool = doc(False, "Parallelise gradient copies to CPU among ranks (stage 1/2 offload)")
    parameter_alignment: bool = doc(False, "Pad stage 1/2 flat buffers to 16-byte aligned parameters",
                                    since="0.19.8")
    zero_hpz_partition_size: int = doc(1, "Ranks in ZeRO++ hierarchical partitioning group", ge=0)
    zero_quantized_weights: bool = doc(False, "ZeRO++: quantise weights for all-gather")
    zero_quantized_nontrainable_weights: bool = doc(False, "ZeRO++: store non-trainable weights quantised")
    zero_quantized_gradients: bool = doc(False, "ZeRO++: quantise gradients for reduce")
    memory_efficient_linear: bool = doc(True, "Memory-efficient linear layer (stage 3)")
    pipeline_loading_checkpoint: bool = doc(False, "Force pipeline-mode checkpoint loading (stage 3)")
    override_module_apply: bool = doc(True, "Override nn.Module.apply (stage 3)")
    log_trace_cache_warnings: bool = doc(False, "Log trace-cache invalidation warnings (stage 3)")
    enable_sanity_checks: bool = doc(False, "Enable internal sanity checks (debugging)")
    save_muon_momentum_buffer_in_memory: bool = doc(False, "Keep Muon momentum in memory with NVMe offload")
