"""``hydra/launcher=dsconf``: the launcher's options, registered in Hydra's ConfigStore.

Imported by Hydra's plugin discovery: no torch here.
"""

from __future__ import annotations

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
    dist: DistConfig = field(default_factory=DistConfig)


ConfigStore.instance().store(group="hydra/launcher", name="dsconf", node=DsconfLauncherConf, provider="dsconf")

try:  # the dsconf config groups, so `python train.py zero=stage2 ...` composes without copying YAML
    from dsconf import groups as _groups
except ImportError:  # dsconf.groups not written yet
    _groups = None
if _groups is not None:
    _groups.register()
