"""Monitoring sections: metric writers (``tensorboard``, ``wandb``, ``csv_monitor``, ``comet``), the FLOPs profiler,
the communication logger and the throughput timers.

Each is null until written (DeepSpeed then applies its own defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, List, Optional

from dsconf.schema._field import doc, section

DEFAULT_JOB_NAME = "DeepSpeedJobName"


@dataclass
class TensorBoardConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.monitor.config.TensorBoardConfig"

    enabled: bool = doc(False, "Log training metrics to TensorBoard (needs the tensorboard package)")
    output_path: str = doc("", "Directory for the event files; empty = under the launch directory")
    job_name: str = doc(DEFAULT_JOB_NAME, "Run name: a subdirectory of output_path")


@dataclass
class WandbConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.monitor.config.WandbConfig"

    enabled: bool = doc(False, "Log training metrics to Weights & Biases (needs the wandb package)")
    group: Optional[str] = doc(None, "W&B group that collects related runs")
    team: Optional[str] = doc(None, "W&B team (entity)")
    project: str = doc("deepspeed", "W&B project")


@dataclass
class CSVConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.monitor.config.CSVConfig"

    enabled: bool = doc(False, "Write training metrics to local CSV files")
    output_path: str = doc("", "Directory for the CSV files; empty = under the launch directory")
    job_name: str = doc(DEFAULT_JOB_NAME, "Run name: a subdirectory of output_path")


@dataclass
class CometConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.monitor.config.CometConfig"

    enabled: bool = doc(False, "Log training metrics to Comet (needs the comet_ml package)")
    samples_log_interval: int = doc(100, "Send metrics to Comet every this many samples")
    project: Optional[str] = doc(None, "Comet project; null = .comet.config or COMET_PROJECT_NAME")
    workspace: Optional[str] = doc(None, "Comet workspace; null = .comet.config or COMET_WORKSPACE")
    api_key: Optional[str] = doc(None, "Comet API key; null = .comet.config or COMET_API_KEY")
    experiment_name: Optional[str] = doc(None, "Comet experiment name; null = COMET_EXPERIMENT_NAME or Comet's")
    experiment_key: Optional[str] = doc(None, "Key of the Comet experiment (32-50 alphanumerics)")
    online: Optional[bool] = doc(None, "Log to the Comet server (else an offline experiment); null = true")
    mode: Optional[str] = doc(None, "How the experiment starts: get, create or get_or_create (Comet's default)")


@dataclass
class FlopsProfilerConfig:
    enabled: bool = doc(False, "Profile FLOPs, latency and parameters (also turns on wall_clock_breakdown)")
    recompute_fwd_factor: float = doc(0.0, "Extra forward passes counted for activation recomputation (0-1)")
    profile_step: int = doc(1, "Training step at which to profile")
    module_depth: int = doc(-1, "Depth of the module tree to report; -1 = innermost")
    top_modules: int = doc(1, "Top modules to list in the aggregated profile")
    detailed: bool = doc(True, "Print the detailed per-module profile")
    output_file: Optional[str] = doc(None, "File for the profile; null = stdout")


@dataclass
class CommsLoggerConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.comm.config.CommsLoggerConfig"

    enabled: bool = doc(False, "Log communication operations (sizes, latency, bandwidth)")
    prof_all: bool = doc(True, "Profile every communication operation")
    prof_ops: List[str] = doc([], "Operations to profile when prof_all is false (e.g. all_reduce)")
    verbose: bool = doc(False, "Print every logged operation immediately")
    debug: bool = doc(False, "Also log the name of the calling function")


@dataclass
class ThroughputTimerConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.utils.config.DeepSpeedThroughputTimerConfig"

    enabled: bool = doc(True, "Measure training throughput")
    synchronized: bool = doc(True, "Synchronise the device when timing (accurate, but slower)")


@dataclass
class TimersConfig:
    throughput: ThroughputTimerConfig = doc(ThroughputTimerConfig(), "Throughput timer")


@dataclass
class MonitoringSections:
    tensorboard: Any = section(TensorBoardConfig, "TensorBoard metrics; null = off")
    wandb: Any = section(WandbConfig, "Weights & Biases metrics; null = off")
    csv_monitor: Any = section(CSVConfig, "CSV metrics files; null = off")
    comet: Any = section(CometConfig, "Comet metrics; null = off")
    flops_profiler: Any = section(FlopsProfilerConfig, "FLOPs profiler; null = off")
    comms_logger: Any = section(CommsLoggerConfig, "Communication logger; null = off")
    timers: Any = section(TimersConfig, "Throughput timers; null = DeepSpeed's defaults (on, synchronised)")
