"""``dsconf show --explain-launch``: what the launcher would do here, and why.

The environment detected (and the variables it read), then either the rank this process is (in place) or what
dsconf would start on this node: nodes, ranks per node, node rank, master or rendezvous, world size, each with the
setting or variable it came from. MPI is never asked anything here (an address only MPI knows is named as such).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Optional

from dsconf.launch.environments import ORDER, detect, settled_dist


def explain_launch(dist: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None, *,
                   gpus: Optional[int] = None) -> list[str]:
    """The explanation's lines for a job whose ``dist`` settings are ``dist`` (every key, defaults included)."""
    from dsconf.schema.dist import DistConfig

    found = detect(environ, gpus=gpus, query=False)
    settled = settled_dist(found, dist)  # a contradiction is the ConfigError the run would stop with
    if found is None:
        lines = ["environment: none detected, dsconf's dist decides (tried " + ", ".join(a.name for a in ORDER) + ")"]
    else:
        position = next(i for i, a in enumerate(ORDER, 1) if a.name == found.name)
        lines = [f"environment: {found.title} (adapter {found.name}, tried {position} of {len(ORDER)})",
                 "variables read:"]
        lines += [f"  {name}={value}".replace("\n", "\\n") for name, value in found.read.items()] or ["  (none)"]
    if found is not None and found.rank is not None:
        rank, sources = found.rank, found.sources
        lines += [f"this process is rank {rank.rank} of {rank.world_size}, started by {found.title}: dsconf runs the "
                  "task here and starts no ranks",
                  f"  nodes: {_nodes(rank.world_size, rank.local_world_size)}, {rank.local_world_size} rank(s) a node "
                  f"({sources.get('WORLD_SIZE', 'the launcher')})",
                  f"  local rank: {rank.local_rank} ({sources.get('LOCAL_RANK', 'the launcher')}), node rank: "
                  f"{rank.node_rank}",
                  f"  master: {rank.master_addr} ({sources.get('MASTER_ADDR', 'the launcher')}), port "
                  f"{rank.master_port} ({sources.get('MASTER_PORT', 'the launcher')})",
                  "  rendezvous: torch's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)",
                  "  torch variables dsconf sets: " + (", ".join(found.exported) or "none (the launcher set them)")]
        return lines
    from dsconf.launch.plan import plan_job

    plan = plan_job(settled)
    defaults = asdict(DistConfig())

    def why(key: str) -> str:
        if found is not None and key in found.sources and (key in found.dist or key in found.defaults):
            if settled.get(key) == found.dist.get(key, found.defaults.get(key)):
                return found.sources[key]
        user = dist.get(key)
        return f"dist.{key}={user}, yours" if str(user) != str(defaults.get(key)) else f"dist.{key}, dsconf's default"

    nodes = str(plan.max_nodes) if plan.min_nodes == plan.max_nodes else f"{plan.min_nodes} to {plan.max_nodes}"
    sizes = ", ".join(str(s) for s in plan.world_sizes)
    lines += ["dsconf starts this node's ranks (torch elastic's agent, as torchrun would):",
              f"  nodes: {nodes} ({why('nnodes')})",
              f"  ranks per node: {plan.nproc_per_node} ({why('nproc_per_node')})",
              f"  node rank: {plan.node_rank} ({why('node_rank')})" if plan.max_nodes > 1 else "  node rank: 0",
              f"  rendezvous: {plan.rdzv_backend} at {plan.rdzv_endpoint} ("
              + ("one node: a free local port, as torchrun --standalone" if plan.rdzv_endpoint == "localhost:0"
                 else why("rdzv_endpoint")) + f"), id {plan.rdzv_id}",
              f"  world size: {sizes}; each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from "
              "torch elastic"]
    return lines


def _nodes(world: int, local_world: int) -> str:
    return str(world // local_world) if local_world and world % local_world == 0 else "unknown"
