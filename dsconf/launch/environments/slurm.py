"""Processes a scheduler started as ranks: SLURM (``srun``, ``sbatch``, submitit) or submitit's local executor.

``srun`` gives each task ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``/``SLURM_NODEID`` and the step's node
list; the task's ``Rank`` is what ``torchrun`` would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT), from SLURM's variables alone (submitit is not needed). MASTER_ADDR and
MASTER_PORT that the batch script exported are kept; otherwise MASTER_ADDR is the step's first node (node lists are
expanded by python-hostlist) and MASTER_PORT is derived from the job and step ids, the same in every task.

LOCAL_RANK is what DeepSpeed passes to ``set_device``, so it must be an index into the devices this task sees:

- every task sees all the node's GPUs (no binding; or the allocation's physical ids, ``4,5,6,7``):
  LOCAL_RANK = SLURM_LOCALID, so local rank ``i`` uses visible device ``i``, a different GPU of the allocation;
- SLURM bound devices to tasks (``--gpus-per-task``, ``--gpu-bind``; a task sees fewer GPUs than the node has
  tasks): LOCAL_RANK = 0, the first of the task's own devices. ``SLURM_LOCALID`` keeps the local rank.

``CUDA_VISIBLE_DEVICES`` is never changed, and device counts never initialise CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from dsconf.launch.environments.base import Adapter, Environment, Rank, derived_port, number, read_vars
from dsconf.world import parse_visible_devices, visible_gpu_count

SLURM_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NODEID",
              "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_GPUS_PER_TASK", "CUDA_VISIBLE_DEVICES",
              "MASTER_ADDR", "MASTER_PORT")
SUBMITIT_LOCAL_VARS = ("SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID",
                       "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_JOB_ID", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
                       "MASTER_PORT")
SLURM_TITLE = "SLURM (srun, sbatch, submitit)"
SUBMITIT_TITLE = "submitit's local executor"
EXPORTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _slurm_present(env: Mapping[str, str]) -> bool:
    return (bool(env.get("SLURM_PROCID")) and env.get("SUBMITIT_EXECUTOR") != "local"
            and number(env, "SLURM_NTASKS", SLURM_TITLE, default=1) > 1)


def _read_slurm(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    import hostlist

    rank, local = number(env, "SLURM_PROCID", SLURM_TITLE), number(env, "SLURM_LOCALID", SLURM_TITLE, default=0)
    world_var = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    world = number(env, world_var, SLURM_TITLE, minimum=1, default=1)
    node = number(env, "SLURM_NODEID", SLURM_TITLE, default=0)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = hostlist.expand_hostlist(nodelist) if nodelist else ["localhost"]
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    counts = hostlist.parse_slurm_tasks_per_node(per_node) if per_node else [world // max(len(hosts), 1)]
    local_world = counts[node] if node < len(counts) else counts[-1]
    job = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    return _environment("slurm", SLURM_TITLE, read_vars(env, SLURM_VARS), env, gpus,
                        rank, local, world, local_world, node, hosts[0], "the step's first node", job,
                        "SLURM_JOB_ID.SLURM_STEP_ID", f"{world_var}={world}")


def _submitit_local_present(env: Mapping[str, str]) -> bool:
    return bool(env.get("SUBMITIT_LOCAL_GLOBALID")) and number(env, "SUBMITIT_LOCAL_NTASKS", SUBMITIT_TITLE,
                                                               default=1) > 1


def _read_submitit_local(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    rank, local, world = (number(env, f"SUBMITIT_LOCAL_{k}", SUBMITIT_TITLE, default=d) for k, d in
                          (("GLOBALID", 0), ("LOCALID", 0), ("NTASKS", 1)))
    return _environment("submitit_local", SUBMITIT_TITLE, read_vars(env, SUBMITIT_LOCAL_VARS), env, gpus,
                        rank, local, world, world, 0, "localhost", "this host", env.get("SUBMITIT_LOCAL_JOB_ID", "0"),
                        "SUBMITIT_LOCAL_JOB_ID", f"SUBMITIT_LOCAL_NTASKS={world}")


def _environment(name: str, title: str, read: dict[str, str], env: Mapping[str, str], gpus: Optional[int], rank: int,
                 local: int, world: int, local_world: int, node: int, host: str, host_source: str, job: str,
                 job_source: str, world_source: str) -> Environment:
    visible = _visible_devices(env, gpus)
    user_addr, user_port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    sources = {"WORLD_SIZE": world_source, "MASTER_ADDR": "MASTER_ADDR, yours" if user_addr else host_source,
               "MASTER_PORT": "MASTER_PORT, yours" if user_port else f"derived from the job's id ({job_source})",
               "LOCAL_RANK": f"the task's local id, an index into the {visible} GPU(s) it sees" if visible else
               "the task's local id"}
    return Environment(name=name, title=title, read=read, sources=sources, exported=EXPORTED, rank=Rank(
        rank=rank, local_rank=device_local_rank(local, local_world, visible, env), world_size=world,
        local_world_size=local_world, node_rank=node, master_addr=user_addr or host,
        master_port=number(env, "MASTER_PORT", title) if user_port else derived_port(job)))


def device_local_rank(local: int, local_world: int, visible: int, environ: Mapping[str, str]) -> int:
    """LOCAL_RANK for a task with local id ``local`` among ``local_world`` that sees ``visible`` GPUs."""
    if visible == 0:
        return local  # CPU ranks: LOCAL_RANK picks no device
    if environ.get("SLURM_GPUS_PER_TASK") or visible < local_world:
        return 0  # SLURM bound this task's own devices: use the first of them
    return local


def _visible_devices(env: Mapping[str, str], gpus: Optional[int]) -> int:
    if gpus is not None:
        return gpus
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return len(parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]))
    return visible_gpu_count()


SLURM = Adapter(name="slurm", title=SLURM_TITLE, variables=SLURM_VARS, present=_slurm_present,
                read=_read_slurm)
SUBMITIT_LOCAL = Adapter(name="submitit_local", title=SUBMITIT_TITLE, variables=SUBMITIT_LOCAL_VARS,
                         present=_submitit_local_present, read=_read_submitit_local)
