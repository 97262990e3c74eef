"""The ``activation_checkpointing`` section (DeepSpeed reads it as a plain dict and ignores unknown keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dsconf.schema._field import doc


@dataclass
class ActivationCheckpointingConfig:
    partition_activations: bool = doc(False, "Partition checkpointed activations across model-parallel ranks")
    cpu_checkpointing: bool = doc(False, "Offload partitioned activations to CPU (needs partition_activations)")
    contiguous_memory_optimization: bool = doc(False, "Copy partitioned activations into contiguous memory")
    number_checkpoints: Optional[int] = doc(None, "Checkpoints per model, sizes the contiguous buffer", ge=1)
    synchronize_checkpoint_boundary: bool = doc(False, "Synchronise the device at each checkpoint boundary")
    profile: bool = doc(False, "Log forward/backward time of each checkpointed function")
