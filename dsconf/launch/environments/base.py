"""The shape every environment adapter has: the variables it reads, and what it yields.

An ``Adapter`` (declared in the module of its environment: ``torchrun``, ``mpi``, ``slurm``, ``kubeflow``,
``skypilot``) has

- ``title`` and ``variables``: the environment's name and every variable the adapter may read;
- ``present(environ)``: whether this process runs in that environment (the variables that mark it are set);
- ``read(environ, gpus=None, query=True)``: an ``Environment``, or a one-line ``ConfigError`` when the
  environment is partial (a variable it needs is missing, or not a number). ``gpus``: the devices this process
  sees (default: counted without initialising CUDA); ``query=False``: read the variables alone, never ask MPI.

What an environment yields is one of two things:

- ``rank``: the processes exist already and this one is a rank of the job (torchrun, DeepSpeed's launcher,
  ``mpirun``, ``srun``, a pod per rank). dsconf exports torch's variables from ``rank`` and runs the task here;
- ``dist``: this process is one node's launcher (a Kubeflow pod that would run ``torchrun``, a SkyPilot node).
  ``dist`` holds the ``dist.*`` settings the environment states; dsconf starts the node's ranks from them.

Reading an environment imports nothing heavy: the standard library, and what an adapter needs for one of its cases
(python-hostlist for SLURM's node lists, mpi4py when only MPI itself can tell the master address).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from dsconf.errors import ConfigError, Problem

MIN_PORT, MAX_PORT = 20000, 60000  # a port derived from a job id, as submitit's TorchDistributedEnvironment
TORCH_DEFAULT_PORT = 29500  # torchrun's and DeepSpeed's MASTER_PORT when nothing says otherwise


@dataclass(frozen=True)
class Rank:
    """One process's place in a job something else started, in torch's terms."""

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


@dataclass(frozen=True)
class Environment:
    """What an adapter found: the environment, the variables it read, and either a rank or ``dist`` settings."""

    name: str  # the adapter's module name: "mpi", "slurm", ...
    title: str  # what the user knows it as: "Open MPI (mpirun/mpiexec)"
    read: dict[str, str]  # every variable read, with its value
    rank: Optional[Rank] = None  # in place: this process is one rank
    dist: dict[str, Any] = field(default_factory=dict)  # a node's launcher: the dist settings the environment states
    defaults: dict[str, Any] = field(default_factory=dict)  # dist settings it suggests, where the user set none
    sources: dict[str, str] = field(default_factory=dict)  # dist key or torch variable -> where its value came from
    exported: tuple[str, ...] = ()  # torch variables dsconf sets from ``rank`` (none when the launcher set them)

    @property
    def in_place(self) -> bool:
        return self.rank is not None


@dataclass(frozen=True)
class Adapter:
    """One environment: how it is recognised and read."""

    name: str
    title: str
    variables: tuple[str, ...]
    present: Callable[[Mapping[str, str]], bool]
    read: Callable[[Mapping[str, str], Optional[int], bool], Environment]


def read_vars(env: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """The variables of ``names`` that are set, with their values."""
    return {name: env[name] for name in names if env.get(name) is not None}


def number(env: Mapping[str, str], name: str, title: str, *, minimum: int = 0, default: Optional[int] = None) -> int:
    """``env[name]`` as an int >= ``minimum`` (``default`` when unset, if given); a one-line error naming the variable
    when missing or malformed."""
    value = env.get(name)
    if (value is None or value == "") and default is not None:
        return default
    if value is None or value == "":
        raise ConfigError(Problem(name, f"is not set, but the other variables of {title} are",
                                  f"{title} sets it for every process; set it, or unset the others"))
    try:
        parsed = int(value.strip())
    except ValueError:
        raise ConfigError(Problem(name, f"{value!r} is not a number", f"{title} sets it to an integer")) from None
    if parsed < minimum:
        raise ConfigError(Problem(name, f"{parsed} is below {minimum}", f"{title} sets it to an integer >= {minimum}"))
    return parsed


def below(name: str, value: int, limit_name: str, limit: int, title: str) -> None:
    """A rank or index must be below its count: a one-line error naming both variables."""
    if value >= limit:
        raise ConfigError(Problem(name, f"{value} is not below {limit_name}={limit}",
                                  f"{title} numbers them from 0 to {limit_name} - 1"))


def derived_port(job_id: str) -> int:
    """A port every process of one job derives alike from its job id, and another job does not."""
    return random.Random(job_id).randint(MIN_PORT, MAX_PORT)


def host_of(endpoint: str) -> str:
    """The host of ``host:port`` (IPv6 ``[::1]:port`` too)."""
    host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    return host.strip("[]")
