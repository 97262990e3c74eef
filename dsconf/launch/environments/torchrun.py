"""Processes a torch-style launcher started as ranks: torchrun, ``python -m torch.distributed.launch``, DeepSpeed's
``deepspeed`` launcher (one node, or every ``--hostfile`` host through pdsh/ssh), Accelerate.

Each rank has RANK, LOCAL_RANK and WORLD_SIZE (and MASTER_ADDR/MASTER_PORT): dsconf exports nothing and runs the
task in place. DeepSpeed's launcher (and torch.distributed.launch without ``--use-env``) also appends
``--local_rank=N`` to the script's arguments, which Hydra's parser refuses: ``local_rank_dropped`` takes it out of a
dsconf app's command line before Hydra parses it (LOCAL_RANK says the same; where it is missing, it is set from the
argument).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch.environments.base import TORCH_DEFAULT_PORT, Adapter, Environment, Rank, read_vars

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_RUN_ID", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")
_LOCAL_RANK_ARG = re.compile(r"^--local[_-]rank(?:=(.*))?$")


def _present(env: Mapping[str, str]) -> bool:
    return all(env.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _title(env: Mapping[str, str]) -> str:
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun (torch elastic)"
    if env.get("CROSS_RANK") is not None and env.get("LOCAL_SIZE") is not None:
        return "DeepSpeed's launcher (deepspeed)"
    return "a torch-style launcher (RANK, LOCAL_RANK, WORLD_SIZE set)"


def _read(env: Mapping[str, str], gpus: Optional[int] = None, query: bool = True) -> Environment:
    def value(name: str, default: str = "0") -> int:
        try:
            return int(env.get(name) or default)
        except ValueError:
            raise ConfigError(Problem(name, f"{env[name]!r} is not a number", "launchers set it to an integer")) \
                from None

    world = value("WORLD_SIZE", "1")
    rank = Rank(rank=value("RANK"), local_rank=value("LOCAL_RANK"), world_size=world,
                local_world_size=value("LOCAL_WORLD_SIZE", env.get("LOCAL_SIZE") or str(world)),
                node_rank=value("GROUP_RANK", env.get("CROSS_RANK") or "0"),
                master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                master_port=value("MASTER_PORT", str(TORCH_DEFAULT_PORT)))
    return Environment(name="torchrun", title=_title(env), read=read_vars(env, VARIABLES), rank=rank,
                       sources={"WORLD_SIZE": f"WORLD_SIZE={world}", "MASTER_ADDR": "the launcher"})


TORCHRUN = Adapter(name="torchrun", title="torchrun, DeepSpeed's launcher (RANK, LOCAL_RANK, WORLD_SIZE)",
                   variables=VARIABLES, present=_present, read=_read)


def local_rank_dropped(argv: list[str], environ: dict[str, str]) -> list[str]:
    """``argv`` without the ``--local_rank=N`` (``--local-rank``, or with N as the next argument) that DeepSpeed's
    launcher appends; sets LOCAL_RANK from it where the launcher did not, and refuses a disagreement."""
    kept: list[str] = []
    given: Optional[str] = None
    args = iter(argv)
    for arg in args:
        match = _LOCAL_RANK_ARG.match(arg)
        if match is None:
            kept.append(arg)
            continue
        given = match.group(1) if match.group(1) is not None else next(args, "")
        if not given.strip().isdigit():
            raise ConfigError(Problem(arg, f"{given!r} is not a local rank",
                                      "DeepSpeed's launcher passes --local_rank=N, N a number"))
    if given is not None:
        current = environ.get("LOCAL_RANK")
        if current is None or current == "":
            environ["LOCAL_RANK"] = given.strip()
        elif current.strip() != given.strip():
            raise ConfigError(Problem("--local_rank", f"{given} disagrees with LOCAL_RANK={current}",
                                      "the launcher sets both alike; unset the one you set yourself"))
    return kept


def refuse_torchrun_options(argv: list[str]) -> None:
    """A torchrun option on a dsconf app's command line (``--nproc_per_node 2``), which Hydra's parser would refuse
    without a word on the way out: a ``ConfigError`` naming the override that says it (``dist.nproc_per_node=2``)."""
    from dsconf.schema.dist import DistConfig
    from dsconf.schema.introspect import fields_of

    keys = set(fields_of(DistConfig))
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or _LOCAL_RANK_ARG.match(arg):
            continue
        flag, given, value = arg.partition("=")
        name = flag[2:].replace("-", "_")
        if not given:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = following if following and not following.startswith("-") and "=" not in following else "VALUE"
        if name in keys:
            override = f"dist.{name}={value}"
        elif name in ("master_addr", "master_port"):
            override = "dist.rdzv_endpoint=HOST:PORT"
        elif name == "standalone":
            override = "nothing: a run on one node is standalone unless dist.rdzv_endpoint says otherwise"
        else:
            continue
        raise ConfigError(Problem(flag, "is torchrun's option; a dsconf app takes launch settings as overrides",
                                  f"write {override}" if override.startswith("dist.") else override))
