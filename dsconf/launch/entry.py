"""``@dsconf.main``: ``@hydra.main`` whose task runs as a torch distributed job.

::

    @dsconf.main(config_path=None, config_name="dsconf", version_base=None)
    def train(cfg):
        engine, *_ = deepspeed.initialize(model=..., config=dsconf.launch.context.deepspeed_config())

``python train.py dist.nproc_per_node=2`` composes and validates the config once, then starts 2 ranks
through torch elastic (``dsconf.launch.core.launch``) and waits for them. The same script runs *in place*
(no relaunch) when the process already is a rank of a distributed job:

- under ``torchrun`` (or any launcher that sets RANK and WORLD_SIZE);
- under SLURM with one task per rank (plain ``srun``/``sbatch``, or Hydra's submitit launcher with
  ``tasks_per_node=N``): the torch variables are exported from SLURM's (``dsconf.launch.scheduler``), each
  task's LOCAL_RANK indexing a GPU of its own inside the allocation.

In both cases the world size comes from the environment (``dsconf.world.env_world_size``).

Errors of a single run end the process without a traceback from dsconf's own frames: a config mistake
prints its problems (exit 2), a failed rank prints that rank's error (exit 1), an interrupt (Ctrl-C, SIGTERM)
at any stage exits 130 with one line.
In a sweep (``-m``) they are raised instead, so the job is reported FAILED and the sweep goes on.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional

from dsconf.config_source import dsconf_app
from dsconf.errors import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, EXIT_JOB_FAILED, ConfigError, exit_with
from dsconf.launch import context
from dsconf.launch.hydra_support import DSCONF_TASK_ATTR

_UNSPECIFIED_: Any = object()


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
                with dsconf_app():  # the Hydra app this creates is dsconf's: its groups, its command line
                    return app(*args, **kwargs)
            except KeyboardInterrupt:  # Ctrl-C while Hydra composes, before a job exists
                exit_with("interrupted", EXIT_INTERRUPTED)

        return entry

    return decorator


def run_task(task_fn: Callable[[Any], Any], cfg: Any) -> Any:
    """Run ``task_fn(cfg)`` in place if this process is already a rank, else as a new distributed job."""
    from dsconf.launch.core import launch
    from dsconf.launch.failures import JobFailed, JobInterrupted

    single_run = not _in_multirun()
    try:
        if in_distributed_env():
            return run_in_place(task_fn, cfg)
        return launch(task_fn, cfg)
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


def in_distributed_env(environ: Optional[dict[str, str]] = None) -> bool:
    """True inside a rank of a running job: torchrun-style variables, or a multi-task SLURM/submitit job."""
    env = os.environ if environ is None else environ
    if env.get("RANK") and env.get("WORLD_SIZE"):
        return True
    if env.get("SLURM_PROCID") and int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return True
    return int(env.get("SUBMITIT_LOCAL_NTASKS", "1") or 1) > 1 and bool(env.get("SUBMITIT_LOCAL_GLOBALID"))


def run_in_place(task_fn: Callable[[Any], Any], cfg: Any) -> Any:
    """This process is one rank: export torch's variables if a scheduler started it, then run the task."""
    from dsconf.launch.hydra_support import hydra_output_dir
    from dsconf.launch.job_export import export_deepspeed
    from dsconf.launch.scheduler import export_scheduler_env
    from dsconf.world import env_world_size

    if not (os.environ.get("RANK") and os.environ.get("WORLD_SIZE")):
        export_scheduler_env()
    job_dir = os.path.abspath(hydra_output_dir() or os.getcwd())
    world_size = env_world_size() or 1
    write_dir = job_dir if context.rank() == 0 else None  # ds_config.json once per job, by rank 0
    deepspeed, _ = export_deepspeed(cfg, world_size, write_dir)
    ds_path = os.path.join(job_dir, context.DS_CONFIG_FILE) if deepspeed is not None else None
    context.set_job_state(deepspeed=deepspeed, job_dir=job_dir, ds_config_path=ds_path)
    from dsconf.launch import trial_meter

    return trial_meter.run(task_fn, cfg, job_dir)  # a tuning trial: measured and stopped after its steps


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
