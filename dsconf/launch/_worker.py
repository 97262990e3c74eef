"""What runs first on every rank: restore the parent's job state, then call the training function.

A rank never re-runs Hydra. It gets, from the process that composed and validated the job: the task
function, the resolved config, the DeepSpeed dict, Hydra's singleton state (``HydraConfig``, the config
store, registered resolvers) and the working dir. With the ``fork`` start method the payload object is
inherited as is; with ``spawn``/``forkserver`` it travels as a cloudpickle file, so closures, functions
of ``__main__`` and resolvers registered at run time reach the ranks too.

This module is imported by every rank: it imports only the standard library up front.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


@dataclass
class RankPayload:
    task_fn: Callable[[Any], Any]
    cfg: Any
    cwd: str
    job_dir: Optional[str] = None
    deepspeed: Optional[dict[str, Any]] = None
    ds_config_path: Optional[str] = None
    hydra_state: Any = None  # hydra.core.singleton.Singleton.get_state(), for ranks that do not fork
    log_level: int = logging.INFO
    extra: dict[str, Any] = field(default_factory=dict)


def dumps(obj: Any) -> bytes:
    """cloudpickle when available (closures, lambdas, ``__main__`` functions), else pickle."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle is a dsconf dependency
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


def run_rank(payload: RankPayload | str) -> bytes:
    """Entry point of every rank started by dsconf; returns the task's return value, pickled.

    ``payload`` is the object itself (fork) or the path of a file holding it, cloudpickled (spawn).
    """
    if isinstance(payload, str):
        with open(payload, "rb") as fh:
            payload = pickle.load(fh)
    _restore_hydra(payload.hydra_state)
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        # A forked rank inherits torch already imported, so the variable alone would not take effect.
        sys.modules["torch"].set_num_threads(int(threads))
    if payload.cwd and os.getcwd() != payload.cwd:
        os.chdir(payload.cwd)
    _configure_rank_logging(payload.log_level)

    from dsconf.launch import context

    context.set_job_state(deepspeed=payload.deepspeed, job_dir=payload.job_dir,
                          ds_config_path=payload.ds_config_path)
    try:
        result = payload.task_fn(payload.cfg)
    except BaseException:
        traceback.print_exc()  # into this rank's stderr log; torch records it in rank{N}.error.json too
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return dumps(result)


def _restore_hydra(state: Any) -> None:
    """Install the parent's Hydra singletons (HydraConfig, ConfigStore, JobRuntime) and resolvers.

    Unlike ``Singleton.set_state`` this does not re-discover plugins: a rank does not need them, and
    discovery imports every ``hydra_plugins`` module. Hydra finds them lazily if the task asks.
    """
    if state is None:
        return
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    Singleton._instances.update(state["instances"])
    BaseContainer._resolvers = state["omegaconf_resolvers"]


def _configure_rank_logging(level: int) -> None:
    """Each rank logs to its own stderr, which the launcher redirects to ``logs/rank{N}.stderr.log``.

    Handlers inherited from the parent (fork) are dropped so that ranks never write the job's log file.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
