"""The ``autotuning`` section, read as a plain dict by DeepSpeed's autotuner (``deepspeed --autotuning``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from dsconf.schema._field import doc, section


@dataclass
class ModelInfoConfig:
    profile: bool = doc(False, "Profile the model to fill in its size (the autotuner's first run)")
    num_params: Optional[int] = doc(None, "Parameters of the model; null = profiled")
    hidden_size: Optional[int] = doc(None, "Hidden size of the model")
    num_layers: Optional[int] = doc(None, "Layers of the model")


@dataclass
class AutotuningConfig:
    enabled: bool = doc(False, "Search ZeRO stage and micro-batch size for the best metric")
    fast: bool = doc(True, "Tune only ZeRO stages and micro-batch sizes, not each stage's knobs")
    results_dir: str = doc("autotuning_results", "Directory for the tuning results", nonempty=True)
    exps_dir: str = doc("autotuning_exps", "Directory for the experiments' configs", nonempty=True)
    overwrite: bool = doc(True, "Overwrite earlier results")
    start_profile_step: int = doc(3, "First step profiled in each experiment")
    end_profile_step: int = doc(5, "Last step profiled in each experiment")
    metric: str = doc("throughput", "Metric to optimise", choices=["latency", "throughput", "flops"])
    metric_path: Optional[str] = doc(None, "File the engine writes the metric to; null = the working directory")
    tuner_type: str = doc("gridsearch", "Search strategy", choices=["gridsearch", "random", "model_based"])
    tuner_early_stopping: int = doc(5, "Stop after this many experiments without improvement")
    tuner_num_trials: int = doc(50, "Most experiments per tuning space")
    arg_mappings: Optional[Dict[str, str]] = doc(
        None, "DeepSpeed key -> training-script argument the autotuner sets (e.g. --micro_batch_size)")
    model_info: Any = section(ModelInfoConfig, "Model size for the model-based tuner; null = not given")
    model_info_path: Optional[str] = doc(None, "File the profiled model info is written to")
    mp_size: int = doc(1, "Model-parallel degree of the training")
    max_train_batch_size: Optional[int] = doc(None, "Largest global batch to try; null = no limit")
    min_train_batch_size: int = doc(1, "Smallest global batch to try")
    max_train_micro_batch_size_per_gpu: int = doc(1024, "Largest micro-batch to try")
    min_train_micro_batch_size_per_gpu: int = doc(1, "Smallest micro-batch to try")
    num_tuning_micro_batch_sizes: int = doc(3, "Micro-batch sizes tried per ZeRO stage")
