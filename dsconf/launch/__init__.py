"""Launching dsconf jobs as torch distributed jobs.

- ``dsconf.launch.core``: one job through torch elastic (``launch(task_fn, cfg)``), as its list of steps:
  ``plan`` (``dist`` into a ``JobPlan``), ``job_export`` (the DeepSpeed dict per world size), ``supervisor``
  (the elastic agent, run in a process of its own), ``failures`` (``JobFailed`` and how a job ends),
  ``hydra_support`` (what the launcher reads from Hydra); ``_worker`` is what every rank runs first.
- ``dsconf.launch.entry``: ``@dsconf.main``, the ``@hydra.main`` whose task runs on every rank.
- ``dsconf.launch.environments``: where the job runs (torchrun, DeepSpeed's launcher, MPI, SLURM, Kubeflow,
  SkyPilot): one adapter each, tried in a documented order; a process they started runs in place as a rank, or
  starts its node's ranks from the ``dist`` settings they state.
- ``dsconf.launch.sweep``: the jobs of a ``-m`` sweep, parallel packing.
- ``dsconf.launch.report``: the sweep's summary (with the jobs' metrics) and ``dsconf report``'s HTML page.
- ``dsconf.launch.context``: what a running rank can ask (the job's DeepSpeed dict, its dir).

``dsconf.launch.launch`` and ``dsconf.launch.deepspeed_config`` are resolved on first use: importing this
package imports nothing, so ``import dsconf.launch.context`` stays cheap on every rank.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "launch": "dsconf.launch.core",
    "JobFailed": "dsconf.launch.failures",
    "JobTimeout": "dsconf.launch.failures",
    "JobInterrupted": "dsconf.launch.failures",
    "deepspeed_config": "dsconf.launch.context",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dsconf.launch' has no attribute {name!r}")
