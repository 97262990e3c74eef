"""torch's variables for a process a scheduler started as one rank: SLURM (``srun``, ``sbatch``, submitit) or
submitit's local executor.

``srun`` gives each task ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``/``SLURM_NODEID`` and the step's node
list; ``scheduler_rank()`` turns them into RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR and MASTER_PORT, as ``torchrun`` would set them, with SLURM's variables alone (submitit is not
needed). MASTER_ADDR and MASTER_PORT that the batch script exported are kept; otherwise MASTER_ADDR is the
step's first node (node lists are expanded by python-hostlist) and MASTER_PORT is derived from the job and step
ids, the same in every task.

LOCAL_RANK is what DeepSpeed passes to ``set_device``, so it must be an index into the devices this task sees:

- every task sees all the node's GPUs (no binding; or the allocation's physical ids, ``4,5,6,7``):
  LOCAL_RANK = SLURM_LOCALID, so local rank ``i`` uses visible device ``i``, a different GPU of the allocation;
- SLURM bound devices to tasks (``--gpus-per-task``, ``--gpu-bind``; a task sees fewer GPUs than the node has
  tasks): LOCAL_RANK = 0, the first of the task's own devices. ``SLURM_LOCALID`` keeps the local rank.

``CUDA_VISIBLE_DEVICES`` is never changed, and device counts never initialise CUDA.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from dsconf.errors import ConfigError, Problem
from dsconf.world import parse_visible_devices, visible_gpu_count

MIN_PORT, MAX_PORT = 20000, 60000  # as submitit's TorchDistributedEnvironment


@dataclass(frozen=True)
class SchedulerRank:
    """One task's place in the job, in torch's terms."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int

    def torch_env(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


def scheduler_rank(environ: Optional[Mapping[str, str]] = None, *, gpus: Optional[int] = None) -> SchedulerRank:
    """This task's rank from SLURM's (or submitit-local's) variables; ``gpus``: devices visible (default: counted)."""
    env = os.environ if environ is None else environ
    if env.get("SUBMITIT_EXECUTOR") == "local" or (env.get("SUBMITIT_LOCAL_GLOBALID") and not env.get("SLURM_PROCID")):
        rank, local, world = (int(env.get(f"SUBMITIT_LOCAL_{k}", d)) for k, d in
                              (("GLOBALID", "0"), ("LOCALID", "0"), ("NTASKS", "1")))
        hosts, node, local_world, job = ["localhost"], 0, world, env.get("SUBMITIT_LOCAL_JOB_ID", "0")
    elif env.get("SLURM_PROCID") is not None:
        import hostlist

        rank, local = int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", "0"))
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        node = int(env.get("SLURM_NODEID", "0"))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        hosts = hostlist.expand_hostlist(nodelist) if nodelist else ["localhost"]
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        counts = hostlist.parse_slurm_tasks_per_node(per_node) if per_node else [world // max(len(hosts), 1)]
        local_world = counts[node] if node < len(counts) else counts[-1]
        job = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    else:
        raise ConfigError(Problem("", "this process looks like a scheduler task, but neither SLURM_PROCID nor "
                                  "submitit's SUBMITIT_LOCAL_* variables are set",
                                  "run it with srun, or set RANK and WORLD_SIZE as torchrun does"))
    visible = _visible_devices(env, gpus)
    return SchedulerRank(rank=rank, local_rank=device_local_rank(local, local_world, visible, env),
                         world_size=world, local_world_size=local_world, node_rank=node,
                         master_addr=env.get("MASTER_ADDR") or hosts[0],
                         master_port=int(env.get("MASTER_PORT") or random.Random(job).randint(MIN_PORT, MAX_PORT)))


def device_local_rank(local: int, local_world: int, visible: int, environ: Mapping[str, str]) -> int:
    """LOCAL_RANK for a task with local id ``local`` among ``local_world`` that sees ``visible`` GPUs."""
    if visible == 0:
        return local  # CPU ranks: LOCAL_RANK picks no device
    if environ.get("SLURM_GPUS_PER_TASK") or visible < local_world:
        return 0  # SLURM bound this task's own devices: use the first of them
    return local


def export_scheduler_env(environ: Optional[dict[str, str]] = None) -> SchedulerRank:
    """Set torch's variables from the scheduler's in ``environ`` (default ``os.environ``); the user's are kept."""
    env = os.environ if environ is None else environ
    task = scheduler_rank(env)
    for key, value in task.torch_env().items():
        if key in ("MASTER_ADDR", "MASTER_PORT"):
            env.setdefault(key, value)
        else:
            env[key] = value
    return task


def _visible_devices(env: Mapping[str, str], gpus: Optional[int]) -> int:
    if gpus is not None:
        return gpus
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return len(parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]))
    return visible_gpu_count()
