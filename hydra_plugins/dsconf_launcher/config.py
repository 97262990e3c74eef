"""``hydra/launcher=dsconf``: the launcher's options, registered in Hydra's ConfigStore.

Imported by Hydra's plugin discovery, for every app: no torch here, and nothing but the launcher's own entry
(under ``hydra/launcher``, where only an app that picks it sees it). dsconf's groups reach dsconf apps alone,
through ``dsconf_searchpath``.
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from dsconf.schema.dist import DistConfig


@dataclass
class DsconfLauncherConf:
    _target_: str = "hydra_plugins.dsconf_launcher.dsconf_launcher.DsconfLauncher"
    # jobs running at once; with GPUs each gets its own CUDA_VISIBLE_DEVICES subset of nproc_per_node devices
    max_parallel_jobs: int = 1
    # stop the running jobs and skip the rest after the first failed job
    fail_fast: bool = False
    # print the summary table and write summary.md / summary.json to the sweep dir
    summary: bool = True
    # `dist` settings for task configs that have no `dist` node (a job's own cfg.dist wins)
    # (start_method auto: fork on hosts without GPUs, spawn otherwise)
    dist: DistConfig = field(default_factory=lambda: DistConfig(start_method="auto"))


ConfigStore.instance().store(group="hydra/launcher", name="dsconf", node=DsconfLauncherConf, provider="dsconf")
