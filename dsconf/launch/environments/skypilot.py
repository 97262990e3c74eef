"""A node of a SkyPilot cluster: ``SKYPILOT_NODE_IPS`` (one IP a line), ``SKYPILOT_NODE_RANK``,
``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE``, set on every node for the task's ``run`` commands.

``python train.py`` there does what SkyPilot's recipe does with ``torchrun --nnodes=$SKYPILOT_NUM_NODES
--nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE --node_rank=$SKYPILOT_NODE_RANK --master_addr=<first IP>``: one node
of a static rendezvous at the first IP, a rank per GPU (without GPUs, ``dist.nproc_per_node`` decides). SkyPilot
names no port: ``MASTER_PORT`` where the user exported it, else one derived from ``SKYPILOT_TASK_ID`` (the same on
every node of a task, another for the next task), else torch's 29500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch.environments.base import (
    TORCH_DEFAULT_PORT,
    Adapter,
    Environment,
    below,
    derived_port,
    number,
    read_vars,
)

VARIABLES = ("SKYPILOT_NODE_IPS", "SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE",
             "SKYPILOT_TASK_ID", "MASTER_PORT")
TITLE = "SkyPilot"


def _present(env: Mapping[str, str]) -> bool:
    return any(env.get(name) is not None for name in VARIABLES[:3])


def _read(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    nodes = number(env, "SKYPILOT_NUM_NODES", TITLE, minimum=1)
    node_rank = number(env, "SKYPILOT_NODE_RANK", TITLE)
    below("SKYPILOT_NODE_RANK", node_rank, "SKYPILOT_NUM_NODES", nodes, TITLE)
    if not (env.get("SKYPILOT_NODE_IPS") or "").strip():
        number(env, "SKYPILOT_NODE_IPS", TITLE)  # the one-line error for a missing variable
    ips = [line.strip() for line in env["SKYPILOT_NODE_IPS"].splitlines() if line.strip()]
    if len(ips) != nodes:
        raise ConfigError(Problem("SKYPILOT_NODE_IPS", f"lists {len(ips)} IP(s), but SKYPILOT_NUM_NODES={nodes}",
                                  "SkyPilot lists one IP a line, one per node"))
    facts: dict[str, Any] = {"nnodes": str(nodes)}
    sources = {"nnodes": f"SKYPILOT_NUM_NODES={nodes}"}
    gpus_per_node = number(env, "SKYPILOT_NUM_GPUS_PER_NODE", TITLE) if env.get("SKYPILOT_NUM_GPUS_PER_NODE") else 0
    if gpus_per_node > 0:
        facts["nproc_per_node"] = gpus_per_node
        sources["nproc_per_node"] = f"SKYPILOT_NUM_GPUS_PER_NODE={gpus_per_node}"
    if nodes > 1:
        if env.get("MASTER_PORT"):
            port, port_source = number(env, "MASTER_PORT", TITLE), f"MASTER_PORT={env['MASTER_PORT']}, yours"
        elif env.get("SKYPILOT_TASK_ID"):
            port, port_source = derived_port(env["SKYPILOT_TASK_ID"]), "a port derived from SKYPILOT_TASK_ID"
        else:
            port, port_source = TORCH_DEFAULT_PORT, "torch's default port"
        facts.update(node_rank=node_rank, rdzv_backend="static", rdzv_endpoint=f"{ips[0]}:{port}")
        sources.update(node_rank=f"SKYPILOT_NODE_RANK={node_rank}", rdzv_backend="static, as SkyPilot's torchrun "
                       "recipe", rdzv_endpoint=f"the first of SKYPILOT_NODE_IPS ({ips[0]}), {port_source}")
    return Environment(name="skypilot", title=TITLE, read=read_vars(env, VARIABLES), dist=facts, sources=sources)


SKYPILOT = Adapter(name="skypilot", title=TITLE, variables=VARIABLES, present=_present, read=_read)
