"""``@dsconf.main``: ``@hydra.main`` whose task runs as a torch distributed job.

::

    @dsconf.main(config_path=None, config_name="dsconf", version_base=None)
    def train(cfg):
        engine, *_ = deepspeed.initialize(model=..., config=dsconf.launch.context.deepspeed_config())

``python train.py dist.nproc_per_node=2`` composes and validates the config once, then starts 2 ranks
through torch elastic (``dsconf.launch.core.launch``) and waits for them. Where something else starts the
processes, ``dsconf.launch.environments`` says what this one is (the adapters, and the order they are tried in):

- a rank already (torchrun, DeepSpeed's ``deepspeed`` launcher, ``mpirun``/``mpiexec``, SLURM's ``srun``, Hydra's
  submitit launcher, a PyTorchJob pod per rank): the script runs *in place*, torch's variables exported from the
  environment's where it has its own, and the world size is the environment's;
- one node's launcher (a Kubeflow pod with torchrun's ``PET_*`` variables, a SkyPilot node): the environment's
  nodes, ranks per node and rendezvous become ``dist`` settings, and dsconf starts this node's ranks.

The user's ``dist.*`` settings win where the environment says nothing; one that contradicts it is a one-line
error. DeepSpeed's launcher appends ``--local_rank=N`` to the script's arguments: a dsconf app drops it before Hydra
parses the command line (other Hydra apps are left alone).

Errors of a single run end the process without a traceback from dsconf's own frames: a config mistake
prints its problems (exit 2), a failed rank prints that rank's error (exit 1), an interrupt (Ctrl-C, SIGTERM)
at any stage exits 130 with one line.
In a sweep (``-m``) they are raised instead, so the job is reported FAILED and the sweep goes on.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional

from dsconf.config_source import dsconf_app
from dsconf.errors import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, EXIT_JOB_FAILED, ConfigError, exit_with
from dsconf.launch import context
from dsconf.launch.hydra_support import DSCONF_TASK_ATTR

_UNSPECIFIED_: Any = object()
ONLY_ONE_MODE = "Only one of --run, --multirun, --cfg"  # hydra._internal.utils._run_hydra's ValueError


def main(config_path: Optional[str] = _UNSPECIFIED_, config_name: Optional[str] = None,
         version_base: Optional[str] = _UNSPECIFIED_) -> Callable[[Callable[[Any], Any]], Any]:
    """Same signature and CLI as ``hydra.main``; the decorated task runs on every rank of a distributed job."""
    import hydra

    kwargs: dict[str, Any] = {"config_name": config_name}
    if config_path is not _UNSPECIFIED_:
        kwargs["config_path"] = config_path
    if version_base is not _UNSPECIFIED_:
        kwargs["version_base"] = version_base
    hydra_main = hydra.main(**kwargs)

    def decorator(task_fn: Callable[[Any], Any]) -> Any:
        @functools.wraps(task_fn)
        def job(cfg: Any) -> Any:
            return run_task(task_fn, cfg)

        setattr(job, DSCONF_TASK_ATTR, task_fn)
        app = hydra_main(job)

        @functools.wraps(app)
        def entry(*args: Any, **kwargs: Any) -> Any:
            try:
                drop_launcher_arguments()
            except ConfigError as err:
                exit_with(str(err), EXIT_CONFIG_ERROR)
            try:
                with dsconf_app():  # the Hydra app this creates is dsconf's: its groups, its command line
                    return app(*args, **kwargs)
            except KeyboardInterrupt:  # Ctrl-C while Hydra composes, before a job exists
                exit_with("interrupted", EXIT_INTERRUPTED)
            except ValueError as err:  # Hydra raises its command-line mistake outside its error reporting
                if not str(err).startswith(ONLY_ONE_MODE):
                    raise
                exit_with(f"{err} (a sweep job's config: the same overrides without -m, and --cfg job)",
                          EXIT_CONFIG_ERROR)

        return entry

    return decorator


def drop_launcher_arguments() -> None:
    """Take the ``--local_rank=N`` DeepSpeed's launcher appends out of ``sys.argv``, before Hydra parses it; refuse
    torchrun's options (``--nproc_per_node 2``) with the override that says the same."""
    if any(arg.startswith("--") and not arg.startswith("--local") for arg in sys.argv[1:]):
        from dsconf.launch.environments.torchrun import refuse_torchrun_options

        refuse_torchrun_options(sys.argv[1:])
    if any(arg.startswith("--local") for arg in sys.argv[1:]):
        from dsconf.launch.environments.torchrun import local_rank_dropped

        sys.argv[1:] = local_rank_dropped(sys.argv[1:], os.environ)  # type: ignore[arg-type]


def run_task(task_fn: Callable[[Any], Any], cfg: Any) -> Any:
    """Run ``task_fn(cfg)`` in place if this process is already a rank, else as a new distributed job."""
    from dsconf.launch.environments import detect
    from dsconf.launch.failures import JobFailed, JobInterrupted

    single_run = not _in_multirun()
    try:
        found = detect()
        if found is not None and found.in_place:
            return run_in_place(task_fn, cfg, found)
        return launch_here(task_fn, cfg, found)
    except ConfigError as err:
        if single_run:
            exit_with(str(err), EXIT_CONFIG_ERROR)
        raise
    except JobInterrupted as err:
        if single_run:
            exit_with(err.headline, EXIT_INTERRUPTED)
        raise
    except JobFailed as err:
        if single_run:
            exit_with(f"job failed: {err}", EXIT_JOB_FAILED)
        raise
    except KeyboardInterrupt:
        if single_run:
            exit_with("interrupted", EXIT_INTERRUPTED)
        raise


def run_in_place(task_fn: Callable[[Any], Any], cfg: Any, found: Any) -> Any:
    """This process is one rank (``found``, an environment in place): export torch's variables from the
    environment's, then run the task."""
    from dsconf.launch.environments import export_rank, settled_dist
    from dsconf.launch.hydra_support import hydra_output_dir
    from dsconf.launch.job_export import export_deepspeed
    from dsconf.launch.plan import dist_settings

    settled_dist(found, dist_settings(cfg))  # a dist setting that contradicts the environment: ConfigError
    export_rank(found)
    job_dir = os.path.abspath(hydra_output_dir() or os.getcwd())
    world_size = found.rank.world_size
    write_dir = job_dir if context.rank() == 0 else None  # ds_config.json once per job, by rank 0
    deepspeed, _ = export_deepspeed(cfg, world_size, write_dir)
    ds_path = os.path.join(job_dir, context.DS_CONFIG_FILE) if deepspeed is not None else None
    context.set_job_state(deepspeed=deepspeed, job_dir=job_dir, ds_config_path=ds_path)
    from dsconf.launch._worker import run_task
    from dsconf.launch.rank_setup import prepare_rank

    prepare_rank()
    return run_task(task_fn, cfg, job_dir)


def launch_here(task_fn: Callable[[Any], Any], cfg: Any, found: Any = None) -> Any:
    """Start this node's ranks: ``dist`` with what the environment states (a Kubeflow pod, a SkyPilot node)."""
    from dsconf.launch.core import launch
    from dsconf.launch.environments import settled_dist
    from dsconf.launch.plan import dist_settings

    if found is None:
        return launch(task_fn, cfg)
    dist = settled_dist(found, dist_settings(cfg))
    set_dist(cfg, dist)  # the task's cfg.dist (and the batch derived from it) is the job that runs
    return launch(task_fn, cfg, dist=dist)


def set_dist(cfg: Any, dist: dict[str, Any]) -> None:
    """Write the ``dist`` settings that differ into ``cfg.dist`` (an OmegaConf node or a mapping), if it has one."""
    from dsconf.launch.hydra_support import select

    node = select(cfg, "dist")
    if node is None:
        return
    changed = {key: value for key, value in dist.items() if key in node and node[key] != value}
    if not changed:
        return
    from omegaconf import DictConfig, open_dict, read_write

    if isinstance(node, DictConfig):
        with read_write(node), open_dict(node):
            for key, value in changed.items():
                node[key] = value
    else:
        node.update(changed)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
