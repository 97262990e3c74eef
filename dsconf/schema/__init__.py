"""Structured-config dataclasses, one module per DeepSpeed concern, keys named as in DeepSpeed's JSON."""

from dsconf.schema.activation_checkpointing import ActivationCheckpointingConfig
from dsconf.schema.autotuning import AutotuningConfig, ModelInfoConfig
from dsconf.schema.checkpointing import (
    AioConfig,
    CheckpointConfig,
    CheckpointingSections,
    CheckpointWriterConfig,
    DataTypesConfig,
)
from dsconf.schema.data_efficiency import DataEfficiencyConfig
from dsconf.schema.deepspeed import DeepSpeedConfig, TrainingKeys
from dsconf.schema.dist import DistConfig
from dsconf.schema.monitoring import (
    CometConfig,
    CommsLoggerConfig,
    CSVConfig,
    FlopsProfilerConfig,
    MonitoringSections,
    TensorBoardConfig,
    TimersConfig,
    WandbConfig,
)
from dsconf.schema.optimizer import OptimizerConfig
from dsconf.schema.parallelism import (
    ExpertParallelConfig,
    HybridEngineConfig,
    ParallelismSections,
    PipelineConfig,
    TensorParallelConfig,
)
from dsconf.schema.precision import AmpConfig, BF16Config, FP16Config, TorchAutocastConfig
from dsconf.schema.removed import (
    CompressionTrainingConfig,
    EigenvalueConfig,
    ElasticityConfig,
    LegacyCurriculumConfig,
    NebulaConfig,
    ProgressiveLayerDropConfig,
    QuantizeTrainingConfig,
    RemovedSections,
)
from dsconf.schema.root import DsconfConfig
from dsconf.schema.runtime import CompileConfig, RuntimeSections, WeightQuantizationConfig
from dsconf.schema.scheduler import SchedulerConfig
from dsconf.schema.zero import (
    LeafModuleConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZenFlowConfig,
    ZeroOptimizationConfig,
)

__all__ = [
    "ActivationCheckpointingConfig", "AioConfig", "AmpConfig", "AutotuningConfig", "BF16Config", "CSVConfig",
    "CheckpointConfig", "CheckpointWriterConfig", "CheckpointingSections", "CometConfig", "CommsLoggerConfig",
    "CompileConfig", "CompressionTrainingConfig", "DataEfficiencyConfig", "DataTypesConfig", "DeepSpeedConfig",
    "DistConfig", "DsconfConfig", "EigenvalueConfig", "ElasticityConfig", "ExpertParallelConfig", "FP16Config",
    "FlopsProfilerConfig", "HybridEngineConfig", "LeafModuleConfig", "LegacyCurriculumConfig", "ModelInfoConfig",
    "MonitoringSections", "NebulaConfig", "OffloadOptimizerConfig", "OffloadParamConfig", "OptimizerConfig",
    "ParallelismSections", "PipelineConfig", "ProgressiveLayerDropConfig", "QuantizeTrainingConfig",
    "RemovedSections", "RuntimeSections", "SchedulerConfig", "TensorBoardConfig", "TensorParallelConfig",
    "TimersConfig", "TorchAutocastConfig", "TrainingKeys", "WandbConfig", "WeightQuantizationConfig",
    "ZenFlowConfig", "ZeroOptimizationConfig",
]
