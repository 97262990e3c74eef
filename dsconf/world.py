"""The world a job runs in: total ranks, and the data-parallel size the batch triple divides by.

Inside a running distributed job (torchrun, or SLURM with one task per rank) the environment is the
truth; before launch, ``dist`` says what the launcher will start.
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Mapping, Optional, Union

from dsconf.errors import ConfigError, Problem
from dsconf.schema.root import DEEPSPEED_NODE

# SLURM variables as srun exports them to each task (one task per rank).
SLURM_WORLD_VARS = ("SLURM_NTASKS", "SLURM_PROCID")


def env_world_size(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """Total ranks if this process already runs inside a distributed job, else None."""
    env = os.environ if environ is None else environ
    if env.get("WORLD_SIZE"):
        return int(env["WORLD_SIZE"])
    if all(env.get(v) for v in SLURM_WORLD_VARS):
        return int(env["SLURM_NTASKS"])
    return None


def parse_nnodes(nnodes: Any) -> tuple[int, int]:
    """``nnodes`` as torchrun reads it: ``N`` or ``MIN:MAX``."""
    text = str(nnodes).strip()
    try:
        if ":" in text:
            low, high = (int(x) for x in text.split(":", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise ConfigError(Problem("dist.nnodes", f"{nnodes!r} is not 'N' or 'MIN:MAX'",
                                  "e.g. dist.nnodes=2 or dist.nnodes=1:4")) from None
    if low < 1 or high < low:
        raise ConfigError(Problem("dist.nnodes", f"{nnodes!r} is not a valid node range",
                                  "need 1 <= MIN <= MAX"))
    return low, high


def resolve_nproc_per_node(nproc: Any) -> int:
    """Workers per node; 'auto'/'gpu' count visible GPUs (one worker when there is none)."""
    if isinstance(nproc, bool):
        nproc = str(nproc)
    if isinstance(nproc, int):
        if nproc < 1:
            raise ConfigError(Problem("dist.nproc_per_node", f"{nproc} is not >= 1"))
        return nproc
    text = str(nproc).strip().lower()
    if text.isdigit():
        return resolve_nproc_per_node(int(text))
    if text in ("auto", "gpu"):
        return max(visible_gpu_count(), 1)
    if text == "cpu":
        return os.cpu_count() or 1
    raise ConfigError(Problem("dist.nproc_per_node", f"{nproc!r} is not a worker count",
                              "valid: a positive int, 'auto', 'gpu' or 'cpu'"))


def parse_visible_devices(text: str) -> Union[List[int], List[str]]:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: ordinals (each read like strtoul, so ``1gpu`` is 1) or
    ``GPU-``/``MIG-`` UUIDs; the list ends at the first entry that is not one, and a repeated entry makes it
    empty."""
    if text.startswith(("GPU-", "MIG-")):
        prefix = text[:4]
        uuids: List[str] = []
        for entry in text.split(","):
            if entry in uuids:
                return []
            if not entry.startswith(prefix):
                break
            uuids.append(entry)
        return uuids
    ordinals: List[int] = []
    for entry in text.split(","):
        match = re.match(r"[+-]?\d+", entry.strip())
        ordinal = int(match.group()) if match else -1
        if ordinal in ordinals:
            return []
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return ordinals


def visible_gpu_count() -> int:
    """GPUs this process may use, without importing torch when CUDA_VISIBLE_DEVICES says. Never initialises CUDA:
    torch's device count asks NVML, where ``torch.cuda.is_available()`` would make forked ranks fail."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len(parse_visible_devices(visible))
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def dist_world_size(dist: Any) -> int:
    """Total ranks the launcher will start for ``dist`` (max node count for an elastic range)."""
    _, max_nodes = parse_nnodes(_get(dist, "nnodes", 1))
    return resolve_nproc_per_node(_get(dist, "nproc_per_node", 1)) * max_nodes


def model_parallel_product(dist: Any) -> int:
    return int(_get(dist, "tensor_parallel_size", 1)) * int(_get(dist, "pipeline_parallel_size", 1))


def sequence_parallel_degree(value: Any) -> int:
    """DeepSpeed's ``sequence_parallel_size`` as a divisor of the world size (1 when not a positive int)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def data_parallel_size(dist: Any = None, *, sequence_parallel_size: Any = None, world_size: Optional[int] = None,
                       environ: Optional[Mapping[str, str]] = None, mesh_data_parallel_size: Any = None) -> int:
    """Data-parallel size: total ranks divided by the tensor/pipeline parallel sizes (``dist``) and DeepSpeed's
    ``sequence_parallel_size`` (None = 1), as DeepSpeed divides its world size.

    Total ranks come from ``world_size`` if given, else the environment of a running job, else ``dist``.
    ``mesh_data_parallel_size`` is DeepSpeed's ``data_parallel_size``: with ``sequence_parallel_size``,
    ``deepspeed.initialize`` builds a (data, sequence) device mesh of all ranks, which must hold exactly the total.
    """
    total = world_size if world_size is not None else env_world_size(environ)
    if total is None:
        total = dist_world_size(dist) if dist is not None else 1
    sequence = sequence_parallel_degree(sequence_parallel_size)
    mesh_data = sequence_parallel_degree(mesh_data_parallel_size)
    if mesh_data_parallel_size is not None and sequence_parallel_size is not None and mesh_data * sequence != total:
        raise ConfigError(Problem(
            f"{DEEPSPEED_NODE}.data_parallel_size", f"{mesh_data} x sequence_parallel_size {sequence} = "
            f"{mesh_data * sequence} ranks, but the job has {total} (deepspeed.initialize's device mesh needs all)",
            f"set it to {total // sequence}, or remove it" if total % sequence == 0 else "remove it"))
    parallel = (model_parallel_product(dist) if dist is not None else 1) * sequence
    if total % parallel:
        raise ConfigError(Problem(
            "dist", f"world size {total} is not divisible by tensor x pipeline x sequence parallel size {parallel}",
            "choose parallel sizes (dist.tensor_parallel_size, dist.pipeline_parallel_size, "
            f"{DEEPSPEED_NODE}.sequence_parallel_size) whose product divides the number of ranks"))
    return total // parallel


def _get(node: Any, key: str, default: Any) -> Any:
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    return getattr(node, key, default)
