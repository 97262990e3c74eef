"""Structured-config dataclasses, one module per DeepSpeed section, keys named as in DeepSpeed's JSON."""

from dsconf.schema.activation_checkpointing import ActivationCheckpointingConfig
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.dist import DistConfig
from dsconf.schema.optimizer import OptimizerConfig
from dsconf.schema.precision import AmpConfig, BF16Config, FP16Config, TorchAutocastConfig
from dsconf.schema.root import DsconfConfig
from dsconf.schema.scheduler import SchedulerConfig
from dsconf.schema.zero import OffloadOptimizerConfig, OffloadParamConfig, ZeroOptimizationConfig

__all__ = [
    "ActivationCheckpointingConfig", "AmpConfig", "BF16Config", "DeepSpeedConfig", "DistConfig", "DsconfConfig",
    "FP16Config", "OffloadOptimizerConfig", "OffloadParamConfig", "OptimizerConfig", "SchedulerConfig",
    "TorchAutocastConfig", "ZeroOptimizationConfig",
]
