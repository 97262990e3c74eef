"""What ``hydra/sweeper=dsconf_tune`` does when Hydra calls it: its settings read, the app's launcher made, the study
run, and how it ends: a settings or config mistake is one line and exit 2, a failed trial one line (its error and its
log dir) and exit 1, with no traceback.

The launcher is the app's own (``hydra/launcher``). dsconf's launcher writes ``summary.md`` after each batch; here
the tuner's ``summary.md`` takes its place, so that launcher's own summary is turned off.
"""

from __future__ import annotations

import copy
from typing import Any, List, Mapping

from dsconf.errors import EXIT_CONFIG_ERROR, ConfigError, exit_with


def setup(settings: Mapping[str, Any], *, hydra_context: Any, task_function: Any, config: Any) -> Any:
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf, open_dict

    from dsconf.tune.settings import read_settings
    from dsconf.tune.study import Tuner

    try:
        checked = read_settings(_plain(settings))
    except ConfigError as err:
        exit_with(_lines(err), EXIT_CONFIG_ERROR)
    launcher_config = config
    if OmegaConf.select(config, "hydra.launcher.summary") is not None:  # dsconf's launcher
        launcher_config = copy.deepcopy(config)
        with open_dict(launcher_config):
            launcher_config.hydra.launcher.summary = False
    launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context, task_function=task_function,
                                                       config=launcher_config)
    return Tuner(checked, config=config, hydra_context=hydra_context, launcher=launcher)


def sweep(tuner: Any, arguments: List[str]) -> Any:
    from dsconf.tune.study import TuneStopped

    try:
        return tuner.sweep(arguments)
    except TuneStopped as err:
        exit_with(str(err), err.code)
    except ConfigError as err:
        exit_with(_lines(err), EXIT_CONFIG_ERROR)


def _lines(err: ConfigError) -> str:
    """The problems of the sweeper's settings without ConfigError's "invalid DeepSpeed config" heading."""
    if not all(p.path.startswith(("hydra.sweeper", "hydra/sweeper")) for p in err.problems):
        return str(err)
    if len(err.problems) == 1:
        return str(err.problems[0])
    return f"{len(err.problems)} problems:\n" + "\n".join(f"  - {p}" for p in err.problems)


def _plain(settings: Mapping[str, Any]) -> dict:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    out = {}
    for key, value in settings.items():
        out[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
    return out
