"""Where a dsconf job runs: one adapter per environment that starts training processes, tried in this order.

======  ====================================  ====================================================  ==========
order   environment                           recognised by                                         yields
======  ====================================  ====================================================  ==========
1       torchrun, DeepSpeed's launcher        RANK, WORLD_SIZE and LOCAL_RANK (``torchrun``)        a rank
2       Open MPI                              OMPI_COMM_WORLD_RANK (``mpi``)                        a rank
3       MPICH, Intel MPI                      MPI_LOCALRANKID (or PMI_RANK, PMI_SIZE > 1, no SLURM) a rank
4       SLURM                                 SLURM_PROCID with SLURM_NTASKS > 1 (``slurm``)        a rank
5       submitit's local executor             SUBMITIT_LOCAL_GLOBALID with SUBMITIT_LOCAL_NTASKS>1  a rank
6       Kubeflow torch runtime / nprocPerNode PET_* (``kubeflow``)                                  ``dist``
7       PyTorchJob, one process per pod       RANK or WORLD_SIZE without LOCAL_RANK                 a rank
8       SkyPilot                              SKYPILOT_NODE_RANK/_NODE_IPS/_NUM_NODES (``skypilot``) ``dist``
======  ====================================  ====================================================  ==========

The order settles environments that overlap: a torchrun or DeepSpeed rank inside a Kubeflow pod or a SLURM job is
a rank of that launcher (1 first); ``mpirun`` inside a SLURM allocation starts ranks whose SLURM variables describe
MPI's daemons (2 and 3 before 4), while ``srun --mpi=pmi2`` sets PMI_RANK without Hydra's MPI_LOCALRANKID in tasks
SLURM describes (3 leaves them to 4); PyTorchJob gives a pod with ``nprocPerNode`` RANK and WORLD_SIZE
of the pod too (6 before 7).

``settled_dist`` joins an environment with the job's ``dist``: the user's ``dist.*`` settings win wherever the
environment says nothing, and a setting that contradicts what the environment states is a one-line ``ConfigError``
naming both, never a silent choice. In an environment that started the ranks already, ``dist.nproc_per_node`` above
1 is such a contradiction: every process is one rank, and dsconf starting more would multiply them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch.environments.base import Adapter, Environment, Rank, host_of
from dsconf.launch.environments.kubeflow import KUBEFLOW, POD_PER_RANK
from dsconf.launch.environments.mpi import MPICH, OPEN_MPI
from dsconf.launch.environments.skypilot import SKYPILOT
from dsconf.launch.environments.slurm import SLURM, SUBMITIT_LOCAL
from dsconf.launch.environments.torchrun import TORCHRUN

__all__ = ["ORDER", "Adapter", "Environment", "Rank", "detect", "export_rank", "settled_dist"]
ORDER: tuple[Adapter, ...] = (TORCHRUN, OPEN_MPI, MPICH, SLURM, SUBMITIT_LOCAL, KUBEFLOW, POD_PER_RANK, SKYPILOT)


def detect(environ: Optional[Mapping[str, str]] = None, *, gpus: Optional[int] = None,
           query: bool = True) -> Optional[Environment]:
    """The environment this process runs in (the first adapter of ``ORDER`` present), or None: dsconf's ``dist``
    alone decides. A partial environment is a one-line ``ConfigError``; ``query=False`` never asks MPI."""
    env = os.environ if environ is None else environ
    for adapter in ORDER:
        if adapter.present(env):
            return adapter.read(env, gpus, query)
    return None


def export_rank(found: Environment, environ: Optional[dict[str, str]] = None) -> None:
    """Set torch's variables of the rank ``found`` in ``environ`` (default ``os.environ``); MASTER_ADDR and
    MASTER_PORT the user exported are kept."""
    env = os.environ if environ is None else environ
    if found.rank is None:
        return
    torch_env = found.rank.torch_env()
    for key in found.exported:
        if key in ("MASTER_ADDR", "MASTER_PORT"):
            env.setdefault(key, torch_env[key])
        else:
            env[key] = torch_env[key]


def settled_dist(found: Optional[Environment], dist: Mapping[str, Any]) -> dict[str, Any]:
    """``dist`` (every key, defaults included) with the environment's settings; contradictions are errors."""
    from dataclasses import asdict

    from dsconf.schema.dist import DistConfig

    merged = dict(dist)
    if found is None:
        return merged
    defaults = asdict(DistConfig())
    problems = _rank_contradictions(found, merged, defaults) if found.in_place else []
    for key, value in found.dist.items():
        user = merged.get(key, defaults.get(key))
        if _set(user, defaults.get(key)) and not _same(key, user, value):
            problems.append(Problem(f"dist.{key}", f"{user!r} contradicts {found.sources.get(key, value)} "
                                    f"({found.title})", f"drop dist.{key}: the environment decides it"))
        elif not (key == "rdzv_endpoint" and _set(user, "")):  # the user's port on the environment's host
            merged[key] = value
    for key, value in found.defaults.items():
        if not _set(merged.get(key, defaults.get(key)), defaults.get(key)):
            merged[key] = value
    if problems:
        raise ConfigError(problems)
    return merged


def _rank_contradictions(found: Environment, dist: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[Problem]:
    from dsconf.world import parse_nnodes, resolve_nproc_per_node

    rank = found.rank
    assert rank is not None
    world = found.sources.get("WORLD_SIZE", f"WORLD_SIZE={rank.world_size}")
    problems = []
    nproc = dist.get("nproc_per_node", 1)
    if _set(nproc, defaults["nproc_per_node"]) and resolve_nproc_per_node(nproc) > 1:
        problems.append(Problem("dist.nproc_per_node", f"{nproc} would start {resolve_nproc_per_node(nproc)} ranks "
                                f"in each of the {rank.world_size} processes {found.title} started ({world}): ranks "
                                "would multiply", "drop dist.nproc_per_node: the launcher decides the ranks"))
    nnodes = dist.get("nnodes", "1")
    if _set(nnodes, defaults["nnodes"]) and rank.world_size % rank.local_world_size == 0:
        nodes = rank.world_size // rank.local_world_size
        if parse_nnodes(nnodes) != (nodes, nodes):
            problems.append(Problem("dist.nnodes", f"{nnodes!r} contradicts the {nodes} node(s) of {found.title} "
                                    f"({rank.world_size} rank(s), {rank.local_world_size} a node)",
                                    "drop dist.nnodes: the launcher decides it"))
    node_rank = dist.get("node_rank", 0)
    if _set(node_rank, defaults["node_rank"]) and int(node_rank) != rank.node_rank:
        problems.append(Problem("dist.node_rank", f"{node_rank!r} contradicts node {rank.node_rank} of {found.title}",
                                "drop dist.node_rank: the launcher decides it"))
    endpoint = str(dist.get("rdzv_endpoint") or "").strip()
    if endpoint and host_of(endpoint) != rank.master_addr and not rank.master_addr.startswith("("):
        problems.append(Problem("dist.rdzv_endpoint", f"{endpoint!r} contradicts MASTER_ADDR={rank.master_addr} "
                                f"({found.sources.get('MASTER_ADDR', found.title)})",
                                "drop dist.rdzv_endpoint, or export MASTER_ADDR to every rank"))
    return problems


def _set(value: Any, default: Any) -> bool:
    """A setting the user made: anything but the field's default (``1`` and ``"1"`` alike)."""
    return value is not None and str(value).strip() != str(default).strip() and value != default


def _same(key: str, user: Any, env: Any) -> bool:
    from dsconf.world import parse_nnodes, resolve_nproc_per_node

    try:
        if key == "nnodes":
            return parse_nnodes(user) == parse_nnodes(env)
        if key == "nproc_per_node":
            return resolve_nproc_per_node(user) == resolve_nproc_per_node(env)
        if key == "rdzv_endpoint":  # the environment states the host; the port may be the user's
            return host_of(str(user).strip()) == host_of(str(env))
        if key in ("node_rank", "max_restarts"):
            return int(user) == int(env)
        if key == "monitor_interval":
            return float(user) == float(env)
    except (ConfigError, TypeError, ValueError):
        return False
    return str(user).strip() == str(env).strip()
