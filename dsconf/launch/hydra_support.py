"""What the launcher reads from Hydra and OmegaConf: a config's nodes, the job's output dir, Hydra's state.

Hydra and OmegaConf are imported inside each function, and Hydra only when the app already imported it, so a
job launched from plain Python (``dsconf.launch.launch(fn, dict)``) never pays for them. Both sides of a sweep use
these: the launcher process (``sweep``) and the jobs' checks (``command_line``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Optional

log = logging.getLogger(__name__)
DSCONF_TASK_ATTR = "__dsconf_task__"  # on a @dsconf.main wrapper: the user's function, which the sweep's jobs run


def select(cfg: Any, key: str) -> Any:
    """``cfg[key]`` of a mapping or an OmegaConf node, None when absent (or unreadable)."""
    if cfg is None:
        return None
    if isinstance(cfg, Mapping):
        return cfg.get(key)
    try:
        return cfg[key] if key in cfg else None
    except Exception:
        return None


def resolved_copy(cfg: Any) -> Any:
    """A copy of ``cfg`` with every interpolation resolved here, so all ranks see the same values."""
    from omegaconf import Container, OmegaConf, read_write

    if not isinstance(cfg, Container):
        return copy.deepcopy(cfg)
    resolved = copy.deepcopy(cfg)
    try:
        with read_write(resolved):
            OmegaConf.resolve(resolved)
    except Exception as err:  # a broken interpolation the task may never read: ranks resolve lazily
        log.warning("could not resolve the config before launch (%s); ranks will resolve it lazily", err)
        return copy.deepcopy(cfg)
    return resolved


def task_cfg(sweep_config: Any) -> Any:
    """A sweep job's config as its task sees it: a copy without the ``hydra`` node."""
    from omegaconf import open_dict, read_write

    cfg = copy.deepcopy(sweep_config)
    with read_write(cfg), open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def hydra_output_dir() -> Optional[str]:
    """The running Hydra job's output dir, or None outside a Hydra app."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.output_dir


def hydra_state() -> Any:
    """Hydra's singletons (``HydraConfig``, the config store, resolvers), for ranks that do not fork."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.singleton import Singleton

    return Singleton.get_state()


@contextlib.contextmanager
def as_sweep_job(job_cfg: Any) -> Iterator[None]:
    """While a sweep job's config is checked in the launching process (before the job exists): ``HydraConfig`` is the
    job's, so that ``${hydra:...}`` in it resolves (HF's ``output_dir: ${hydra:runtime.output_dir}``); the output dir,
    which only the job itself makes, reads as the sweep dir."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    if select(job_cfg, "hydra") is None:
        yield
        return
    instance = HydraConfig.instance()
    previous = instance.cfg
    cfg = copy.deepcopy(job_cfg)
    with open_dict(cfg):
        if OmegaConf.is_missing(cfg.hydra.runtime, "output_dir") or not cfg.hydra.runtime.get("output_dir"):
            cfg.hydra.runtime.output_dir = str(OmegaConf.select(cfg, "hydra.sweep.dir", default="."))
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = previous
