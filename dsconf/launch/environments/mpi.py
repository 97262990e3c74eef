"""Processes an MPI launcher started as ranks: ``mpirun``/``mpiexec`` of Open MPI, MPICH or Intel MPI (Kubeflow's
MPI runtime and DeepSpeed's ``--launcher openmpi|mpich|impi`` start jobs this way).

Every process is already a rank: Open MPI gives it ``OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE``; MPICH and
Intel MPI (their Hydra process manager) ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``. MPI
says nothing of a TCP rendezvous, so the master address is, in this order:

1. ``MASTER_ADDR``, where the user exported it;
2. this host, when every rank is on it (the local size is the world size);
3. the first host of the hostfile MPI was given through its environment (Open MPI's
   ``OMPI_MCA_orte_default_hostfile``, as Kubeflow sets it, or ``OMPI_MCA_prte_default_hostfile``/
   ``PRTE_MCA_prte_default_hostfile``; MPICH's ``HYDRA_HOST_FILE``; Intel MPI's ``I_MPI_HYDRA_HOST_FILE``): by
   default ``mpirun`` places rank 0 on it;
4. rank 0's address (the first of ``hostname -I``, as DeepSpeed's own MPI discovery), sent to every rank through MPI
   itself, when ``mpi4py`` is installed (it is imported only then).

``MASTER_PORT`` is the user's, else derived from the job's PMIx namespace (the same in every rank of one job, another
in the next job), else torch's 29500. The node rank assumes ranks placed by slot, ``mpirun``'s default.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch.environments.base import (
    TORCH_DEFAULT_PORT,
    Adapter,
    Environment,
    Rank,
    below,
    derived_port,
    number,
    read_vars,
)

HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_prte_default_hostfile", "PRTE_MCA_prte_default_hostfile",
                 "HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE")
JOB_ID_VARS = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
USER_VARS = ("MASTER_ADDR", "MASTER_PORT")
OPEN_MPI_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")
HYDRA_VARS = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _read_mpi(env: Mapping[str, str], names: tuple[str, ...], name: str, title: str, query: bool) -> Environment:
    rank_var, size_var, local_var, local_size_var = names
    world = number(env, size_var, title, minimum=1)
    rank = number(env, rank_var, title)
    below(rank_var, rank, size_var, world, title)
    local_world = number(env, local_size_var, title, minimum=1)
    local = number(env, local_var, title)
    below(local_var, local, local_size_var, local_world, title)
    if local_world > world:
        raise ConfigError(Problem(local_size_var, f"{local_world} is above {size_var}={world}",
                                  f"{title} never puts more ranks on a node than the job has"))
    sources = {"WORLD_SIZE": f"{size_var}={world}", "LOCAL_RANK": f"{local_var}={local}"}
    master = master_address(env, local_world == world, sources, query)
    port, sources["MASTER_PORT"] = master_port(env)
    variables = (*names, *USER_VARS, *HOSTFILE_VARS, *JOB_ID_VARS)
    return Environment(name=name, title=title, read=read_vars(env, variables), sources=sources,
                       rank=Rank(rank=rank, local_rank=local, world_size=world, local_world_size=local_world,
                                 node_rank=rank // local_world, master_addr=master, master_port=port),
                       exported=("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                 "MASTER_PORT"))


def master_address(env: Mapping[str, str], one_node: bool, sources: dict[str, str], query: bool) -> str:
    """Rank 0's host (see the module's docstring for the order); records where it came from in ``sources``."""
    if env.get("MASTER_ADDR"):
        sources["MASTER_ADDR"] = "MASTER_ADDR, yours"
        return env["MASTER_ADDR"]
    if one_node:
        sources["MASTER_ADDR"] = "this host: every rank of the job is on it"
        return "127.0.0.1"
    for var in HOSTFILE_VARS:
        path = env.get(var)
        host = first_host(path) if path else None
        if host:
            sources["MASTER_ADDR"] = f"the first host of the hostfile {path} ({var})"
            return host
    if not _mpi4py_installed():
        raise ConfigError(Problem("MASTER_ADDR", "is needed: the job's ranks are on several nodes and nothing here "
                                  "says which one is rank 0's",
                                  "export MASTER_ADDR=<rank 0's host> to every rank (mpirun -x MASTER_ADDR), give "
                                  "MPI a hostfile through OMPI_MCA_orte_default_hostfile, or pip install mpi4py"))
    sources["MASTER_ADDR"] = "rank 0's address, sent to every rank through MPI (mpi4py)"
    return rank0_address() if query else "(rank 0's, when the job starts)"


def _mpi4py_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):  # a broken or blocked install
        return False


def master_port(env: Mapping[str, str]) -> tuple[int, str]:
    if env.get("MASTER_PORT"):
        try:
            return int(env["MASTER_PORT"]), "MASTER_PORT, yours"
        except ValueError:
            raise ConfigError(Problem("MASTER_PORT", f"{env['MASTER_PORT']!r} is not a port number",
                                      "e.g. MASTER_PORT=29500")) from None
    for var in JOB_ID_VARS:
        if env.get(var):
            return derived_port(env[var]), f"derived from the job's id ({var})"
    return TORCH_DEFAULT_PORT, "torch's default"


def first_host(path: str) -> Optional[str]:
    """The first host of an MPI hostfile (``host slots=N``, ``host:N`` or ``host``; ``#`` comments), or None when
    the file cannot be read here (Kubeflow mounts it on the launcher's pod only)."""
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                words = line.split("#", 1)[0].split()
                if words:
                    return words[0].split(":", 1)[0]
    except OSError:
        return None
    return None


def rank0_address() -> str:
    """Rank 0's address, the same in every rank: rank 0 asks its host, MPI broadcasts the answer."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm.bcast(this_host_address() if comm.Get_rank() == 0 else None, root=0)


def this_host_address() -> str:
    """The first address of ``hostname -I`` (as DeepSpeed's ``mpi_discovery``), else the host name's."""
    try:
        words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        words = []
    if words:
        return words[0]
    import socket

    return socket.gethostbyname(socket.gethostname())


def _open_mpi_present(env: Mapping[str, str]) -> bool:
    return env.get("OMPI_COMM_WORLD_RANK") is not None


def _read_open_mpi(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    return _read_mpi(env, OPEN_MPI_VARS, "openmpi", "Open MPI (mpirun/mpiexec)", query)


def _hydra_present(env: Mapping[str, str]) -> bool:
    # Hydra's own MPI_LOCALRANKID; PMI_RANK alone only outside SLURM (srun --mpi=pmi2 sets it in tasks SLURM
    # describes) and in a job of more than one process
    return env.get("MPI_LOCALRANKID") is not None or (env.get("PMI_RANK") is not None and not env.get("SLURM_PROCID")
                                                       and (env.get("PMI_SIZE") or "1").strip() != "1")


def _read_hydra(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    return _read_mpi(env, HYDRA_VARS, "mpich", "MPICH or Intel MPI (mpirun/mpiexec)", query)


OPEN_MPI = Adapter(name="openmpi", title="Open MPI (mpirun/mpiexec)", present=_open_mpi_present, read=_read_open_mpi,
                   variables=(*OPEN_MPI_VARS, *USER_VARS, *HOSTFILE_VARS, *JOB_ID_VARS))
MPICH = Adapter(name="mpich", title="MPICH, Intel MPI (mpirun/mpiexec)", present=_hydra_present, read=_read_hydra,
                variables=(*HYDRA_VARS, *USER_VARS, *HOSTFILE_VARS, *JOB_ID_VARS, "SLURM_PROCID"))
