"""dsconf's base config, registered as ``dsconf``: the ``deepspeed`` node, ``dist`` and the groups' defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from dsconf.schema._field import doc
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.dist import DistConfig
from dsconf.schema.integrations import HfConfig

# The root key under which the DeepSpeed config lives (``DsconfConfig.deepspeed``): the first part of every path to a
# DeepSpeed key (``deepspeed.zero_optimization.stage``) and the package of every group option.
DEEPSPEED_NODE = "deepspeed"

# Group -> option chosen when the user picks none. ``_self_`` first so that groups override the schema.
DEFAULT_GROUPS = {
    "precision": "fp32",
    "zero": "stage0",
    "optimizer": "adam",
    "scheduler": "none",
    "activation_checkpointing": "none",
    "sparse_attention": "none",
}


@dataclass
class DsconfConfig:
    # Sweeps (-m) run each job as a distributed job through dsconf's launcher.
    defaults: List[Any] = field(default_factory=lambda: ["_self_"] + [{g: o} for g, o in DEFAULT_GROUPS.items()]
                                + [{"override hydra/launcher": "dsconf"}])
    deepspeed: DeepSpeedConfig = doc(DeepSpeedConfig(), "DeepSpeed's configuration, in its JSON vocabulary")
    dist: DistConfig = doc(DistConfig(), "How the job is launched (torchrun's knobs)")
    deepspeed_version: Optional[str] = doc(None, "DeepSpeed version the config targets; null = the installed one")
    keep_auto: bool = doc(False, "The config goes to HF Trainer/Accelerate: keep HF's 'auto' values for them to fill")
    hf: Optional[HfConfig] = doc(None, "HF Trainer: fill 'auto' from TrainingArguments at compose time, as HF does")
