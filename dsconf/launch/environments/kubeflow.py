"""Kubernetes pods of a Kubeflow job: the torch runtime of Kubeflow Trainer (v2) and PyTorchJob (v1).

- **Trainer's torch runtime, PyTorchJob with ``nprocPerNode``** (and its ``elasticPolicy``): the pod is one node and
  gets torchrun's flags as ``PET_*`` variables (torchrun reads ``PET_<FLAG>`` as the default of ``--<flag>``):
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, and for an
  elastic job ``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT``, ``PET_RDZV_ID``, ``PET_RDZV_CONF``, ``PET_MAX_RESTARTS``.
  ``python train.py`` under dsconf does what ``torchrun train.py`` would: they become ``dist.*`` settings and dsconf
  starts the pod's ranks. As torchrun, the rendezvous is ``static`` at ``PET_MASTER_ADDR:PET_MASTER_PORT`` unless
  ``PET_RDZV_BACKEND`` says otherwise, and ``PET_NPROC_PER_NODE=auto`` is one rank per GPU, else one per CPU.
- **PyTorchJob with one process per pod**: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (the pods) and
  ``RANK`` (the pod's index), no ``LOCAL_RANK``: the pod's process is a rank already; it runs in place as local
  rank 0 of its node. The same holds anywhere RANK and WORLD_SIZE are set without LOCAL_RANK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch.environments.base import (
    TORCH_DEFAULT_PORT,
    Adapter,
    Environment,
    Rank,
    below,
    number,
    read_vars,
)

# torchrun's flags as Kubeflow sets them, and the dist key each one is
PET_FLAGS = {"PET_NNODES": "nnodes", "PET_NPROC_PER_NODE": "nproc_per_node", "PET_NODE_RANK": "node_rank",
             "PET_RDZV_BACKEND": "rdzv_backend", "PET_RDZV_ENDPOINT": "rdzv_endpoint", "PET_RDZV_ID": "rdzv_id",
             "PET_RDZV_CONF": "rdzv_conf", "PET_MAX_RESTARTS": "max_restarts",
             "PET_MONITOR_INTERVAL": "monitor_interval", "PET_START_METHOD": "start_method"}
PET_VARS = (*PET_FLAGS, "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_STANDALONE", "MASTER_ADDR", "MASTER_PORT", "RANK",
            "WORLD_SIZE")
POD_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "KUBERNETES_SERVICE_HOST")
TITLE = "Kubeflow (Trainer's torch runtime, PyTorchJob with nprocPerNode)"
POD_TITLE = "PyTorchJob, one process per pod (RANK and WORLD_SIZE without LOCAL_RANK)"


def _nproc_is_number(env: Mapping[str, str]) -> bool:
    return (env.get("PET_NPROC_PER_NODE") or "").strip().isdigit()


def _present(env: Mapping[str, str]) -> bool:
    if not any(env.get(name) is not None for name in (*PET_FLAGS, "PET_MASTER_ADDR", "PET_MASTER_PORT")):
        return False
    # PyTorchJob without nprocPerNode (PET_NPROC_PER_NODE=auto) gives each pod RANK and WORLD_SIZE of one process
    # per pod: that process is a rank (POD_PER_RANK), not a node's launcher
    one_per_pod = env.get("RANK") is not None and env.get("WORLD_SIZE") is not None and not _nproc_is_number(env)
    return not one_per_pod


def _read(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    from dsconf.world import parse_nnodes

    facts: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def fact(key: str, value: Any, source: str) -> None:
        facts[key], sources[key] = value, source

    nnodes = (env.get("PET_NNODES") or "1").strip()
    try:
        _, max_nodes = parse_nnodes(nnodes)
    except ConfigError:
        raise ConfigError(Problem("PET_NNODES", f"{nnodes!r} is not 'N' or 'MIN:MAX'", "as torchrun's --nnodes")) \
            from None
    fact("nnodes", nnodes, f"PET_NNODES={nnodes}" if env.get("PET_NNODES") else "torchrun's default (1)")
    nproc = (env.get("PET_NPROC_PER_NODE") or "").strip()
    if nproc.isdigit():
        fact("nproc_per_node", int(nproc), f"PET_NPROC_PER_NODE={nproc}")
    elif nproc in ("auto", "gpu", "cpu"):  # torchrun's meaning: a rank per GPU, else per CPU (auto)
        defaults["nproc_per_node"] = nproc if nproc != "auto" else _torchrun_auto(gpus)
        sources["nproc_per_node"] = f"PET_NPROC_PER_NODE={nproc}"
    elif nproc:
        raise ConfigError(Problem("PET_NPROC_PER_NODE", f"{nproc!r} is not a number of processes",
                                  "a positive int, 'auto', 'gpu' or 'cpu', as torchrun's --nproc-per-node"))
    if env.get("PET_STANDALONE") is not None:  # torchrun --standalone: one node, its own rendezvous
        if max_nodes > 1:
            raise ConfigError(Problem("PET_STANDALONE", f"is set with PET_NNODES={nnodes}",
                                      "a standalone job has one node"))
        return Environment(name="kubeflow", title=TITLE, read=read_vars(env, PET_VARS), dist=facts, defaults=defaults,
                           sources=sources)
    backend = (env.get("PET_RDZV_BACKEND") or "static").strip()
    fact("rdzv_backend", backend, f"PET_RDZV_BACKEND={backend}" if env.get("PET_RDZV_BACKEND") else
         "torchrun's default (static)")
    if env.get("PET_NODE_RANK") is not None or (backend == "static" and max_nodes > 1):
        node_rank = number(env, "PET_NODE_RANK", TITLE)
        below("PET_NODE_RANK", node_rank, "PET_NNODES", max_nodes, TITLE)
        fact("node_rank", node_rank, f"PET_NODE_RANK={node_rank}")
    endpoint = (env.get("PET_RDZV_ENDPOINT") or "").strip()
    if endpoint:
        fact("rdzv_endpoint", endpoint, f"PET_RDZV_ENDPOINT={endpoint}")
    elif backend == "static":
        addr_var = "PET_MASTER_ADDR" if env.get("PET_MASTER_ADDR") else "MASTER_ADDR"
        port_var = "PET_MASTER_PORT" if env.get("PET_MASTER_PORT") else "MASTER_PORT"
        if env.get(addr_var):
            port = number(env, port_var, TITLE) if env.get(port_var) else TORCH_DEFAULT_PORT
            fact("rdzv_endpoint", f"{env[addr_var]}:{port}", f"{addr_var}={env[addr_var]}, "
                 + (f"{port_var}={port}" if env.get(port_var) else f"torchrun's default port {port}"))
        elif max_nodes > 1:
            raise ConfigError(Problem("PET_MASTER_ADDR", f"is not set, but PET_NNODES={nnodes}",
                                      "every node needs the address of node 0 (Kubeflow sets it)"))
    elif max_nodes > 1:
        raise ConfigError(Problem("PET_RDZV_ENDPOINT", f"is not set, but PET_RDZV_BACKEND={backend} and "
                                  f"PET_NNODES={nnodes}", "every node needs the rendezvous host:port"))
    for var, key in (("PET_RDZV_ID", "rdzv_id"), ("PET_START_METHOD", "start_method")):
        if env.get(var):
            fact(key, env[var].strip(), f"{var}={env[var].strip()}")
    if env.get("PET_RDZV_CONF"):  # torchrun's "key=value,key=value"
        pairs = [item.split("=", 1) for item in env["PET_RDZV_CONF"].split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ConfigError(Problem("PET_RDZV_CONF", f"{env['PET_RDZV_CONF']!r} is not key=value,key=value",
                                      "as torchrun's --rdzv-conf"))
        fact("rdzv_conf", {k.strip(): v.strip() for k, v in pairs}, f"PET_RDZV_CONF={env['PET_RDZV_CONF']}")
    if env.get("PET_MAX_RESTARTS"):
        fact("max_restarts", number(env, "PET_MAX_RESTARTS", TITLE), f"PET_MAX_RESTARTS={env['PET_MAX_RESTARTS']}")
    if env.get("PET_MONITOR_INTERVAL"):
        try:
            fact("monitor_interval", float(env["PET_MONITOR_INTERVAL"]),
                 f"PET_MONITOR_INTERVAL={env['PET_MONITOR_INTERVAL']}")
        except ValueError:
            raise ConfigError(Problem("PET_MONITOR_INTERVAL", f"{env['PET_MONITOR_INTERVAL']!r} is not a number",
                                      "seconds, as torchrun's --monitor-interval")) from None
    return Environment(name="kubeflow", title=TITLE, read=read_vars(env, PET_VARS), dist=facts, defaults=defaults,
                       sources=sources)


def _torchrun_auto(gpus: Optional[int]) -> Any:
    """torchrun's ``--nproc-per-node=auto``: one rank per GPU, else one per CPU (``dist.nproc_per_node=cpu``)."""
    from dsconf.world import visible_gpu_count

    count = visible_gpu_count() if gpus is None else gpus
    return count if count > 0 else "cpu"


def _pod_present(env: Mapping[str, str]) -> bool:
    return (env.get("RANK") is not None or env.get("WORLD_SIZE") is not None) and not env.get("LOCAL_RANK")


def _read_pod(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    title = POD_TITLE if env.get("KUBERNETES_SERVICE_HOST") else "RANK and WORLD_SIZE without LOCAL_RANK"
    world = number(env, "WORLD_SIZE", title, minimum=1)
    rank = number(env, "RANK", title)
    below("RANK", rank, "WORLD_SIZE", world, title)
    if world > 1:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not env.get(var):
                raise ConfigError(Problem(var, f"is not set, but WORLD_SIZE={world}",
                                          "every rank needs rank 0's MASTER_ADDR and MASTER_PORT (PyTorchJob sets "
                                          "both)"))
    port = number(env, "MASTER_PORT", title) if env.get("MASTER_PORT") else TORCH_DEFAULT_PORT
    return Environment(name="pytorchjob", title=title, read=read_vars(env, POD_VARS),
                       sources={"WORLD_SIZE": f"WORLD_SIZE={world}", "LOCAL_RANK": "0: one process per pod",
                                "MASTER_ADDR": "MASTER_ADDR" if env.get("MASTER_ADDR") else "this host"},
                       exported=("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
                       rank=Rank(rank=rank, local_rank=0, world_size=world, local_world_size=1, node_rank=rank,
                                 master_addr=env.get("MASTER_ADDR") or "127.0.0.1", master_port=port))


KUBEFLOW = Adapter(name="kubeflow", title=TITLE, variables=PET_VARS, present=_present, read=_read)
POD_PER_RANK = Adapter(name="pytorchjob", title=POD_TITLE, variables=POD_VARS, present=_pod_present, read=_read_pod)
