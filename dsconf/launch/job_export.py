"""The job's DeepSpeed dict, exported and validated before any rank starts, per world size the job may form.

A fixed world gets one dict, saved as ``<job dir>/ds_config.json``. An elastic node range (``dist.nnodes=MIN:MAX``)
gets one per world size it allows, every size's problems reported at once; the ranks take the dict of the world
that formed, and rank 0 saves that one (``_worker``, through ``save_ds_config``). This host's accelerator judges
the precision too (``dsconf.hardware``): a job it cannot run fails here, not in every rank.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from dsconf.errors import ConfigError, Problem, config_warnings_to_stderr
from dsconf.launch import context
from dsconf.launch.hydra_support import select
from dsconf.launch.plan import JobPlan


def export_deepspeed(cfg: Any, world_size: int, job_dir: Optional[str]) -> tuple[Optional[dict], Optional[str]]:
    """The plain DeepSpeed dict for ``world_size`` ranks and the ``ds_config.json`` it was saved to."""
    if select(cfg, "deepspeed") is None:
        return None, None
    with config_warnings_to_stderr(show=context.rank() == 0):  # once per job, not once per rank
        deepspeed = _checked_dict(cfg, world_size)
    if not job_dir:
        return deepspeed, None
    return deepspeed, save_ds_config(deepspeed, job_dir)


def export_for_world_sizes(cfg: Any, world_sizes: list[int], plan: JobPlan) -> dict[int, dict]:
    """One validated DeepSpeed dict per world size an elastic node range allows; every size's problems at once."""
    if select(cfg, "deepspeed") is None:
        return {}
    dicts: dict[int, dict] = {}
    problems: list[Problem] = []
    with config_warnings_to_stderr(show=context.rank() == 0):  # once per job, not once per world size
        for world_size in world_sizes:
            try:
                dicts[world_size] = _checked_dict(cfg, world_size)
            except ConfigError as err:
                if len(world_sizes) == 1:  # a fixed world: the problems as a single run reports them
                    raise
                nodes = world_size // plan.nproc_per_node
                problems += [Problem(p.path, f"with {nodes} node(s) of dist.nnodes={plan.min_nodes}:"
                                     f"{plan.max_nodes} (world size {world_size}): {p.message}", p.hint)
                             for p in err.problems if p not in problems]
    if problems:
        raise ConfigError(problems)
    return dicts


def _checked_dict(cfg: Any, world_size: int) -> dict:
    from dsconf.export import to_deepspeed
    from dsconf.hardware import hardware_problems

    deepspeed = to_deepspeed(cfg, world_size=world_size)
    problems = hardware_problems(deepspeed)  # before any rank starts: a precision this host's accelerator lacks
    if problems:
        raise ConfigError(problems)
    return deepspeed


def save_ds_config(deepspeed: dict, job_dir: str) -> str:
    """Write ``deepspeed`` as the job's ``ds_config.json`` (what ``context.deepspeed_config()`` reads back)."""
    os.makedirs(job_dir, exist_ok=True)
    path = os.path.join(job_dir, context.DS_CONFIG_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(deepspeed, fh, indent=2)
        fh.write("\n")
    return path
