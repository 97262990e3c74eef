"""Launch settings under ``dist``: torchrun's knobs, and the model parallel sizes that divide the world.

The sequence parallel size is DeepSpeed's own key, ``deepspeed.sequence_parallel_size`` (DeepSpeed divides the
world size by it too), so it lives there and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from dsconf.schema._field import doc


@dataclass
class DistConfig:
    nproc_per_node: Any = doc(1, "Workers per node: an int, or 'auto'/'gpu' (one per visible GPU, else one)")
    nnodes: Any = doc("1", "Number of nodes, 'N' or 'MIN:MAX' as in torchrun")
    node_rank: int = doc(0, "Rank of this node (static rendezvous)", ge=0)
    rdzv_backend: str = doc("c10d", "Rendezvous backend", choices=["c10d", "static", "etcd", "etcd-v2"])
    rdzv_endpoint: str = doc("", "Rendezvous endpoint host:port; empty = this host on a free port")
    rdzv_id: str = doc("", "Rendezvous id shared by all nodes of a job; empty = fresh per launch (several nodes: "
                           "the scheduler's job id)")
    rdzv_conf: Dict[str, Any] = doc({}, "torchrun's --rdzv-conf: join_timeout, last_call_timeout, read_timeout, "
                                        "is_host, ...")
    max_restarts: int = doc(0, "Worker group restarts before the job fails", ge=0)
    monitor_interval: float = doc(0.1, "Seconds between worker health checks", gt=0)
    start_method: str = doc("auto", "How workers start; auto = fork without GPUs, spawn with them",
                            choices=["auto", "spawn", "fork", "forkserver"])
    timeout: Optional[float] = doc(None, "Seconds before a job is stopped, rendezvous included; null = no limit", gt=0)
    init_timeout: float = doc(600.0, "Seconds a rank may wait for its peers in process-group init (as DeepSpeed)", gt=0)
    tensor_parallel_size: int = doc(1, "Model (tensor) parallel size; divides the data-parallel size", ge=1)
    pipeline_parallel_size: int = doc(1, "Pipeline parallel size; divides the data-parallel size", ge=1)


# Every key torch's rendezvous backends read from --rdzv-conf (c10d/dynamic, etcd, static).
RDZV_CONF_KEYS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
                  "keep_alive_max_attempt", "read_timeout", "is_host", "store_type", "timeout", "protocol",
                  "ca_cert", "ssl_cert", "ssl_cert_key", "etcd_prefix", "rank")
