"""``dist`` read into a ``JobPlan``: workers per node, node range, rendezvous, limits. No torch import.

The settings are checked against ``DistConfig``'s field metadata (its types, bounds, choices and defaults are the
only statement of them), then the rendezvous is chosen as torchrun would. A single-node job without an endpoint
rendezvouses like ``torchrun --standalone`` (c10d on ``localhost:0``, a fresh run id), so concurrent jobs on one
host never collide; a multi-node job needs an endpoint, and every node derives the same rendezvous id without
talking to the others.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from dsconf.errors import ConfigError, Problem, did_you_mean
from dsconf.launch.hydra_support import select
from dsconf.schema.dist import RDZV_CONF_KEYS, DistConfig
from dsconf.world import parse_nnodes, resolve_nproc_per_node, visible_gpu_count

# torch's rendezvous join_timeout default (not a dsconf setting: dist.rdzv_conf.join_timeout overrides it)
JOIN_TIMEOUT_S = 600.0
# the scheduler's job id, the same on every node of a job and new for each job: a fresh rendezvous id per launch
JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "JOB_ID")


@dataclass(frozen=True)
class JobPlan:
    """``dist`` resolved into what one node's elastic agent needs."""

    nproc_per_node: int
    min_nodes: int
    max_nodes: int
    node_rank: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int
    monitor_interval: float
    start_method: str
    timeout: Optional[float]
    init_timeout: float = 600.0
    rdzv_conf: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.max_nodes

    @property
    def world_sizes(self) -> list[int]:
        """Every world size the node range allows (one, unless ``dist.nnodes=MIN:MAX``)."""
        return [self.nproc_per_node * n for n in range(self.min_nodes, self.max_nodes + 1)]

    @property
    def join_timeout(self) -> float:
        """Seconds torch allows the rendezvous (``dist.rdzv_conf.join_timeout``, else torch's default)."""
        return float(self.rdzv_conf.get("join_timeout") or JOIN_TIMEOUT_S)


def dist_settings(cfg: Any = None, defaults: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The job's ``dist`` settings: ``DistConfig`` defaults, then ``defaults`` (the launcher's), then ``cfg.dist``."""
    from omegaconf import DictConfig, OmegaConf

    merged = asdict(DistConfig())
    for layer in (defaults, select(cfg, "dist")):
        if layer is None:
            continue
        if isinstance(layer, DictConfig):
            layer = OmegaConf.to_container(layer, resolve=True)
        merged.update({k: v for k, v in dict(layer).items()})
    return merged


def checked_dist(dist: Mapping[str, Any]) -> dict[str, Any]:
    """``dist`` over ``DistConfig``'s defaults, each key checked against its field's metadata (all problems at once)."""
    from dsconf.validation.settings import settings_problems

    problems = settings_problems(dist, DistConfig, "dist")
    if problems:
        raise ConfigError(problems)
    return {**asdict(DistConfig()), **dist}


def plan_job(dist: Mapping[str, Any], *, job_num: Optional[int] = None,
             environ: Optional[Mapping[str, str]] = None) -> JobPlan:
    """Validate ``dist`` and choose the rendezvous; raises ``ConfigError`` naming the bad key."""
    env = os.environ if environ is None else environ
    rdzv_conf = rendezvous_conf(dist.get("rdzv_conf"))  # a mapping, or torchrun's k=v,k=v text: checked, a mapping
    dist = checked_dist({**dist, "rdzv_conf": rdzv_conf})
    nproc = resolve_nproc_per_node(dist["nproc_per_node"])
    min_nodes, max_nodes = parse_nnodes(dist["nnodes"])
    start_method = dist["start_method"]
    if start_method == "auto":  # fork is fast and safe without GPUs; spawn keeps CUDA out of the parent
        start_method = "fork" if visible_gpu_count() == 0 else "spawn"
    endpoint = dist["rdzv_endpoint"].strip()
    backend = dist["rdzv_backend"]
    rdzv_id = dist["rdzv_id"]
    if max_nodes == 1 and not endpoint:
        # like torchrun --standalone: c10d on a free local port, a fresh run id
        backend, endpoint, rdzv_id = "c10d", "localhost:0", rdzv_id or uuid.uuid4().hex
    elif not endpoint:
        raise ConfigError(Problem("dist.rdzv_endpoint", f"is required when dist.nnodes={dist['nnodes']!r}",
                                  "give the same host:port on every node, e.g. dist.rdzv_endpoint=node0:29400"))
    elif max_nodes > 1:
        # every node must derive the same id without talking to the others: the user's, else the scheduler's job
        # id (new for each job); each sweep job gets its own
        if not rdzv_id:
            rdzv_id = next((f"dsconf-{env[v]}" for v in JOB_ID_VARS if env.get(v)), "")
        if not rdzv_id:
            if backend.startswith("etcd"):
                # an etcd rendezvous outlives its job: a reused id finds the last run's closed rendezvous
                raise ConfigError(Problem("dist.rdzv_id", f"is required with dist.rdzv_backend={backend} outside a "
                                          "scheduler job", "give a new id for each launch, the same on every node"))
            rdzv_id = "dsconf"  # c10d: the store lives and dies with this job's host agent
        rdzv_id += f"-{job_num}" if job_num is not None else ""
    else:
        rdzv_id = rdzv_id or uuid.uuid4().hex
    timeout = dist["timeout"]
    return JobPlan(
        nproc_per_node=nproc, min_nodes=min_nodes, max_nodes=max_nodes, node_rank=dist["node_rank"],
        rdzv_backend=backend, rdzv_endpoint=endpoint, rdzv_id=rdzv_id, max_restarts=dist["max_restarts"],
        monitor_interval=float(dist["monitor_interval"]), start_method=start_method,
        timeout=float(timeout) if timeout is not None else None, init_timeout=float(dist["init_timeout"]),
        rdzv_conf=rdzv_conf,
    )


def rendezvous_conf(conf: Any) -> dict[str, Any]:
    """``dist.rdzv_conf`` (a mapping, or torchrun's ``k=v,k=v`` text) checked against the keys torch reads."""
    if conf is None or conf == "":
        return {}
    if isinstance(conf, str):
        from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

        try:
            conf = _parse_rendezvous_config(conf)
        except ValueError as err:
            raise ConfigError(Problem("dist.rdzv_conf", str(err), "e.g. dist.rdzv_conf='join_timeout=60'")) from None
    if not isinstance(conf, Mapping):
        raise ConfigError(Problem("dist.rdzv_conf", f"{conf!r} is not a mapping",
                                  "e.g. dist.rdzv_conf.join_timeout=60"))
    unknown = [Problem(f"dist.rdzv_conf.{key}", "not a rendezvous setting torch reads",
                       did_you_mean(str(key), RDZV_CONF_KEYS)) for key in conf if key not in RDZV_CONF_KEYS]
    if unknown:
        raise ConfigError(unknown)
    return {str(k): v for k, v in conf.items()}
