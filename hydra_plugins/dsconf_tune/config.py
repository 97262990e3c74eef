"""``hydra/sweeper=dsconf_tune``: the tuner's settings, registered in Hydra's ConfigStore.

Imported by Hydra's plugin discovery, for every app: no torch or Optuna here, and nothing but the sweeper's own entry
(under ``hydra/sweeper``, where only an app that picks it sees it). The settings and their defaults are stated once,
in ``dsconf.tune.settings.TuneConfig``.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from dsconf.tune.settings import TuneConfig


@dataclass
class DsconfTuneConf(TuneConfig):
    _target_: str = "hydra_plugins.dsconf_tune.dsconf_tune_sweeper.DsconfTuneSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="dsconf_tune", node=DsconfTuneConf, provider="dsconf")
