"""The Hydra ``Sweeper`` for ``hydra/sweeper=dsconf_tune``; the work is in ``dsconf.tune.study``."""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class DsconfTuneSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.tuner: Optional[Any] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from dsconf.tune.sweeper import setup

        self.tuner = setup(self.settings, hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        from dsconf.tune.sweeper import sweep

        assert self.tuner is not None, "setup() was not called"
        return sweep(self.tuner, arguments)
