"""The ``data_efficiency`` section: curriculum data sampling, dynamic batching and random-LTD data routing.

DeepSpeed reads it as nested plain dicts (``deepspeed.runtime.data_pipeline``): the fixed keys below are typed;
the curriculum metrics are keyed by names the user chooses and their schedules depend on the schedule type, so
they stay free-form. Keys marked "required when enabled" have no default in DeepSpeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from dsconf.schema._field import doc, section


@dataclass
class CurriculumLearningConfig:
    enabled: bool = doc(False, "Sample data by difficulty following a curriculum")
    data_cluster_path: Optional[str] = doc(None, "Directory for the data clusters (required when enabled)")
    curriculum_metrics: Optional[Dict[str, Any]] = doc(
        None, "Metric name -> {index_to_sample_path, difficulty_type, min/max_difficulty, schedule_type, ...}")


@dataclass
class DynamicBatchingConfig:
    enabled: bool = doc(False, "Pack variable-length samples into batches of up to max_tokens")
    metrics_path: Optional[str] = doc(None, "Directory of the data analyzer's seqlen metric")
    lr_scaling_method: str = doc("linear", "Learning-rate scaling with the batch size: linear, sqrt or none",
                                 choices=["linear", "sqrt", "none"])
    min_batch_size: int = doc(1, "Smallest batch (samples)")
    max_batch_size: Optional[int] = doc(None, "Largest batch (samples); null = no limit")
    sequence_picking_order: str = doc("dataloader", "Order samples are packed in",
                                      choices=["dataloader", "random", "seqlen"])
    max_tokens: Optional[int] = doc(None, "Tokens per batch (required when enabled)")
    verbose: bool = doc(False, "Log the batches built")


@dataclass
class DataSamplingConfig:
    enabled: bool = doc(False, "Use DeepSpeed's data sampler")
    num_epochs: int = doc(1000, "Epochs the sampler can serve")
    num_workers: int = doc(0, "Data loader worker processes")
    pin_memory: bool = doc(False, "Pin the data loader's memory")
    curriculum_learning: CurriculumLearningConfig = doc(CurriculumLearningConfig(), "Curriculum learning")
    dynamic_batching: DynamicBatchingConfig = doc(DynamicBatchingConfig(), "Variable batch size and LR scaling")


@dataclass
class RandomLTDScheduleParams:
    require_steps: Optional[int] = doc(None, "Steps to grow from min_value to max_value")
    seq_per_step: Optional[int] = doc(None, "Kept tokens grow in multiples of this")


@dataclass
class RandomLTDScheduleConfig:
    min_value: Optional[int] = doc(None, "Tokens kept per layer at the start")
    max_value: Optional[int] = doc(None, "Tokens kept per layer at the end (the full sequence)")
    schedule_type: str = doc("fixed_linear", "Schedule of the kept tokens", choices=["fixed_linear"])
    schedule_config: RandomLTDScheduleParams = doc(RandomLTDScheduleParams(), "Schedule parameters")


@dataclass
class LayerTokenLRScheduleConfig:
    enabled: bool = doc(False, "Layer-token learning-rate schedule (DeepSpeed raises NotImplementedError if on)")
    total_layer_tokens: Optional[int] = doc(None, "Layer tokens of the whole run")
    warmup_type: Optional[str] = doc(None, "Warm-up type")
    warmup_layer_tokens: Optional[int] = doc(None, "Layer tokens of the warm-up")


@dataclass
class RandomLTDConfig:
    enabled: bool = doc(False, "Random layerwise token dropping")
    total_layer_num: Optional[int] = doc(None, "Layers of the model (required when enabled)")
    random_ltd_layer_num: Optional[int] = doc(None, "Layers that drop tokens (required when enabled)")
    random_ltd_layer_id: Optional[List[int]] = doc(None, "Indices of the layers that drop tokens")
    model_mask_name: Optional[str] = doc(None, "Name of the attention-mask argument of the layers")
    model_type: Optional[str] = doc(None, "encoder or decoder", choices=["encoder", "decoder"])
    hidden_state_order: Optional[str] = doc(None, "Layout of the hidden states",
                                            choices=["batch_seq_dim", "seq_batch_dim"])
    random_ltd_schedule: Any = section(RandomLTDScheduleConfig, "Schedule of the kept tokens (required when enabled)")
    layer_token_lr_schedule: LayerTokenLRScheduleConfig = doc(LayerTokenLRScheduleConfig(),
                                                              "Layer-token learning-rate schedule")


@dataclass
class DataRoutingConfig:
    enabled: bool = doc(False, "Use data routing")
    random_ltd: RandomLTDConfig = doc(RandomLTDConfig(), "Random layerwise token dropping")


@dataclass
class DataEfficiencyConfig:
    enabled: bool = doc(False, "Use the data efficiency library")
    seed: int = doc(1234, "Seed of the data sampler")
    data_sampling: DataSamplingConfig = doc(DataSamplingConfig(), "Curriculum data sampling and dynamic batching")
    data_routing: DataRoutingConfig = doc(DataRoutingConfig(), "Data routing (random-LTD)")
