"""The Hydra ``Launcher`` for ``hydra/launcher=dsconf``; the work is in ``dsconf.launch.sweep``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class DsconfLauncher(Launcher):
    def __init__(self, max_parallel_jobs: int = 1, fail_fast: bool = False, summary: bool = True,
                 dist: Optional[Any] = None) -> None:
        from dsconf.launch.sweep import LauncherOptions

        if isinstance(dist, DictConfig):
            dist = OmegaConf.to_container(dist, resolve=True)
        self.options = LauncherOptions(max_parallel_jobs=max(int(max_parallel_jobs), 1), fail_fast=bool(fail_fast),
                                       summary=bool(summary), dist=dict(dist or {}))
        self.runner: Optional[Any] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from dsconf.launch.sweep import SweepRunner

        self.runner = SweepRunner(hydra_context=hydra_context, task_function=task_function, config=config,
                                  options=self.options)

    def use_composed_jobs(self, composed: Any) -> None:
        """Configs of this sweep's jobs, composed already by dsconf's sweep check (``dsconf.launch.sweep_check``)."""
        assert self.runner is not None, "setup() was not called"
        self.runner.composed_jobs = composed

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.runner is not None, "setup() was not called"
        return self.runner.launch(job_overrides, initial_job_idx)
