"""Launch settings under ``dist``: torchrun's knobs, and the model parallel sizes that divide the world.

The sequence parallel size is DeepSpeed's own key, ``deepspeed.sequence_parallel_size`` (DeepSpeed divides the
world size by it too), so it lives there and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsconf.schema._field import doc


@dataclass
class DistConfig:
    nproc_per_node: Any = doc(1, "Workers per node: an int, or 'auto'/'gpu' (one per visible GPU, else one)")
    nnodes: Any = doc("1", "Number of nodes, 'N' or 'MIN:MAX' as in torchrun")
    node_rank: int = doc(0, "Rank of this node (static rendezvous)", ge=0)
    rdzv_backend: str = doc("c10d", "Rendezvous backend", choices=["c10d", "static", "etcd", "etcd-v2"])
    rdzv_endpoint: str = doc("", "Rendezvous endpoint host:port; empty = this host on a free port")
    rdzv_id: str = doc("", "Rendezvous id shared by all nodes of a job; empty = generated per job")
    max_restarts: int = doc(0, "Worker group restarts before the job fails", ge=0)
    monitor_interval: float = doc(0.1, "Seconds between worker health checks", gt=0)
    start_method: str = doc("auto", "How workers start; auto = fork without GPUs, spawn with them",
                            choices=["auto", "spawn", "fork", "forkserver"])
    timeout: Optional[float] = doc(None, "Seconds before a running job is stopped; null = no limit", gt=0)
    tensor_parallel_size: int = doc(1, "Model (tensor) parallel size; divides the data-parallel size", ge=1)
    pipeline_parallel_size: int = doc(1, "Pipeline parallel size; divides the data-parallel size", ge=1)
