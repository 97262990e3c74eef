"""What a rank knows about the job it runs in: the exact DeepSpeed dict, the job dir, its rank.

Inside a training function started by dsconf (``@dsconf.main``, ``python train.py -m``, or an external
torchrun/SLURM running the same script), ``deepspeed_config()`` returns the dict that was validated and
saved as ``ds_config.json`` for this job, without re-composing or re-validating anything::

    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=dsconf.launch.context.deepspeed_config())

It returns a fresh copy on every call (DeepSpeed mutates the dict it is given). Importing this module
imports nothing heavy.

A task whose samples are token sequences may say how long they are (``report_sequence_length(n)``): a tuning trial
then reports tokens per second besides samples per second.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Optional

# Exported to every rank dsconf starts (and set by the in-place path under torchrun/SLURM).
JOB_DIR_ENV = "DSCONF_JOB_DIR"
DS_CONFIG_ENV = "DSCONF_DEEPSPEED_CONFIG"  # path of the job's ds_config.json
DS_CONFIG_FILE = "ds_config.json"

_state: dict[str, Any] = {}


def set_job_state(*, deepspeed: Optional[dict[str, Any]], job_dir: Optional[str],
                  ds_config_path: Optional[str] = None) -> None:
    """Record this rank's job facts (called by dsconf's rank bootstrap, not by users)."""
    _state.clear()
    _state["deepspeed"] = deepspeed
    _state["job_dir"] = job_dir
    if job_dir:
        os.environ[JOB_DIR_ENV] = job_dir
    if ds_config_path:
        os.environ[DS_CONFIG_ENV] = ds_config_path


def deepspeed_config() -> dict[str, Any]:
    """The plain DeepSpeed dict of the running job (a copy), as saved in its ``ds_config.json``."""
    if _state.get("deepspeed") is not None:
        return copy.deepcopy(_state["deepspeed"])
    path = os.environ.get(DS_CONFIG_ENV)
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    raise RuntimeError("no DeepSpeed config for this process: it was not started by dsconf, or its config "
                       "has no 'deepspeed' node; call dsconf.to_deepspeed(cfg) instead")


def job_dir() -> Optional[str]:
    """The job's output dir (the same on every rank), or None outside a dsconf job."""
    return _state.get("job_dir") or os.environ.get(JOB_DIR_ENV)


def report_sequence_length(tokens: int) -> None:
    """Tokens per sample of this task (for a tuning trial's tokens per second); call on any rank."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"report_sequence_length: a whole number of tokens >= 1, got {tokens!r}")
    _state["sequence_length"] = tokens


def sequence_length() -> Optional[int]:
    """What ``report_sequence_length`` was told, or None."""
    return _state.get("sequence_length")


def rank() -> int:
    """Global rank of this process (0 outside a distributed job)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))
