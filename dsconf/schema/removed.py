"""Top-level sections DeepSpeed 0.19.8 removed: it refuses each of them whenever present, even empty or false.

They are modelled from DeepSpeed 0.19.5 (which still reads them), so a config that targets 0.19.5 is checked
as before; for 0.19.8 each field's ``instead`` carries DeepSpeed's own advice. The ZeRO keys 0.19.8 removed
live in :mod:`dsconf.schema.zero`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from dsconf.schema._field import doc, section
from dsconf.schema.precision import AmpConfig

REMOVED_IN = "0.19.8"


@dataclass
class CompressionTrainingConfig:
    """DeepSpeed's compression library; each technique block is {shared_parameters, different_groups}."""

    weight_quantization: Optional[Dict[str, Any]] = doc(None, "Weight quantization technique block")
    activation_quantization: Optional[Dict[str, Any]] = doc(None, "Activation quantization technique block")
    sparse_pruning: Optional[Dict[str, Any]] = doc(None, "Sparse pruning technique block")
    row_pruning: Optional[Dict[str, Any]] = doc(None, "Row pruning technique block")
    head_pruning: Optional[Dict[str, Any]] = doc(None, "Attention-head pruning technique block")
    channel_pruning: Optional[Dict[str, Any]] = doc(None, "Channel pruning technique block")
    layer_reduction: Optional[Dict[str, Any]] = doc(
        None, "Layer reduction (distillation): {enabled, keep_number_layer, module_name_prefix, teacher_layer, ...}")


@dataclass
class EigenvalueConfig:
    enabled: bool = doc(False, "Eigenvalue-based MoQ (0.19.5 refuses true: 'temporarily disabled')")
    verbose: bool = doc(False, "Print the computed eigenvalues")
    max_iter: int = doc(100, "Most power iterations")
    tol: float = doc(1e-2, "Convergence tolerance of the power iteration")
    stability: float = doc(1e-6, "Variance stabilisation factor")
    gas_boundary_resolution: int = doc(1, "Compute eigenvalues every N gradient-accumulation boundaries")
    layer_name: str = doc("bert.encoder.layer", "Module path of the model's layer list")
    layer_num: int = doc(0, "Layers to compute eigenvalues for")


@dataclass
class QuantizeTrainingConfig:
    """DeepSpeed 0.19.5 reads only the ``eigenvalue`` block here; MoQ's own keys moved to compression_training."""

    eigenvalue: EigenvalueConfig = doc(EigenvalueConfig(),
                                       "Eigenvalue settings, read when MoQ weight quantization is on")


@dataclass
class ProgressiveLayerDropConfig:
    enabled: bool = doc(False, "Drop transformer layers progressively during training")
    theta: float = doc(1.0, "Final keep probability (lower = more dropping)")
    gamma: float = doc(0.001, "How fast the keep probability decays")


@dataclass
class NebulaConfig:
    enabled: bool = doc(False, "Checkpoint through Azure Nebula")
    enable_nebula_load: bool = doc(True, "Load checkpoints through Nebula")
    nebula_load_path: Optional[str] = doc(None, "Path Nebula loads from; null = persistent_storage_path")
    persistent_storage_path: Optional[str] = doc(None, "Persistent storage for Nebula checkpoints")
    persistent_time_interval: int = doc(100, "Seconds between persisting checkpoints")
    num_of_version_in_retention: int = doc(2, "Checkpoint versions kept")


@dataclass
class ElasticityConfig:
    enabled: bool = doc(False, "Elastic training: DeepSpeed picks the batch sizes for any GPU count")
    max_train_batch_size: int = doc(2000, "Largest acceptable global batch")
    micro_batch_sizes: List[int] = doc([2, 4, 6], "Acceptable micro-batch sizes (positive)")
    min_gpus: int = doc(1, "Fewest GPUs the job may run on", ge=1)
    max_gpus: int = doc(10000, "Most GPUs the job may run on", ge=1)
    num_gpus_per_node: int = doc(1, "GPUs per node (elasticity v0.2)", ge=1)
    model_parallel_size: int = doc(1, "Model-parallel degree (> 1 needs version 0.2)", ge=1)
    min_time: int = doc(0, "Minimum running time (minutes) before scaling", ge=0)
    prefer_larger_batch: bool = doc(True, "Prefer the larger of equally good batch sizes")
    ignore_non_elastic_batch_info: bool = doc(False, "Ignore the batch keys elasticity overrides (else an error)")
    version: float = doc(0.2, "Elasticity algorithm version", choices=[0.1, 0.2])


@dataclass
class LegacyCurriculumConfig:
    """The curriculum learning of DeepSpeed < 0.19.8 (not data_efficiency's); ``enabled`` must be written."""

    enabled: bool = doc(False, "Legacy curriculum learning")
    curriculum_type: Optional[str] = doc(None, "Difficulty metric, e.g. seqlen (required when enabled)")
    min_difficulty: Optional[int] = doc(None, "Starting difficulty (required when enabled)")
    max_difficulty: Optional[int] = doc(None, "Final difficulty (required when enabled)")
    schedule_type: Optional[str] = doc(None, "Schedule (required when enabled)",
                                       choices=["fixed_discrete", "fixed_root", "fixed_linear", "custom"])
    schedule_config: Optional[Dict[str, Any]] = doc(
        None, "Schedule parameters: difficulty/max_step, or total_curriculum_step/difficulty_step/root_degree")


@dataclass
class RemovedSections:
    amp: Any = section(AmpConfig, "NVIDIA Apex AMP; null = off", until=REMOVED_IN,
                       instead="Apex AMP was removed: use fp16, bf16 or torch_autocast "
                               "(precision=fp16, precision=bf16 or precision=torch_autocast)")
    sparse_attention: Any = doc(None, "Sparse attention layout {mode, ...}; null = off", until=REMOVED_IN,
                                instead="DeepSpeed Sparse Attention was removed: use sparse_attention=none, or target "
                                        "an older DeepSpeed via deepspeed_version")
    sparse_gradients: Optional[bool] = doc(None, "Sparse all-reduce of torch.nn.Embedding gradients", until=REMOVED_IN,
                                           instead="remove it; embeddings built with sparse=True are still reduced "
                                                   "sparsely, without a flag")
    compression_training: Any = section(CompressionTrainingConfig, "Compression library (quantization, pruning); "
                                        "null = off", until=REMOVED_IN,
                                        instead="DeepSpeed's compression library was removed: remove it (the model "
                                                "would train unquantized)")
    quantize_training: Any = section(QuantizeTrainingConfig, "Mixture-of-Quantization (MoQ) settings; null = off",
                                     until=REMOVED_IN, instead="Mixture-of-Quantization (MoQ) was removed: remove it")
    progressive_layer_drop: Any = section(ProgressiveLayerDropConfig, "Progressive Layer Dropping; null = off",
                                          until=REMOVED_IN, instead="Progressive Layer Dropping was removed: remove it")
    eigenvalue: Any = section(EigenvalueConfig, "Eigenvalue MoQ (0.19.5 reads it only inside quantize_training)",
                              until=REMOVED_IN, instead="eigenvalue-based MoQ was removed: remove it")
    nebula: Any = section(NebulaConfig, "Azure Nebula checkpointing; null = off", until=REMOVED_IN,
                          instead="Nebula checkpointing was removed: remove it (checkpoints are saved with torch.save)")
    elasticity: Any = section(ElasticityConfig, "Elastic training; null = off", until=REMOVED_IN,
                              instead="elastic training was removed: set train_batch_size / "
                                      "train_micro_batch_size_per_gpu / gradient_accumulation_steps directly")
    graph_harvesting: Optional[bool] = doc(None, "Capture CUDA graphs of short kernel sequences; null = off (false)",
                                           until=REMOVED_IN, instead="graph harvesting was removed: remove it")
    curriculum_learning: Any = section(LegacyCurriculumConfig, "Legacy curriculum learning; null = off",
                                       until=REMOVED_IN,
                                       instead="use data_efficiency.data_sampling.curriculum_learning instead")
