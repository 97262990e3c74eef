"""What runs first on every rank: restore the parent's job state, then call the training function.

A rank never re-runs Hydra. It gets, from the process that composed and validated the job: the task
function, the resolved config, the DeepSpeed dict, Hydra's singleton state (``HydraConfig``, the config
store, registered resolvers) and the working dir. With the ``fork`` start method the payload object is
inherited as is; with ``spawn``/``forkserver`` it travels as a cloudpickle file, so closures, functions
of ``__main__`` and resolvers registered at run time reach the ranks too.

This module is imported by every rank: it imports only the standard library up front (and ``rank_setup``, which
imports nothing else).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# the standard library only, imported before ranks fork
from dsconf.launch.rank_setup import end_process_group_at_exit, prepare_rank

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


@dataclass
class RankPayload:
    task_fn: Callable[[Any], Any]
    cfg: Any
    cwd: str
    job_dir: Optional[str] = None
    deepspeed: Optional[dict[str, Any]] = None
    deepspeed_by_world: dict[int, dict[str, Any]] = field(default_factory=dict)  # elastic node range: per world size
    ds_config_path: Optional[str] = None
    init_timeout: Optional[float] = None  # dist.init_timeout: seconds a rank may wait in process-group init
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
    # A forked rank inherits torch elastic's SIGTERM handler, which only raises once the rank runs Python
    # again: a rank hung in C code would wait out the agent's 30 s grace. Default handlers end it at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parent = os.getppid()
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the agent died before the line above took effect
        os._exit(1)
    if isinstance(payload, str):
        with open(payload, "rb") as fh:
            payload = pickle.load(fh)
    else:
        import gc

        # A forked rank inherits the launcher's objects (torch, Hydra, the tools' modules): left in the collected
        # generations, every full collection walks them and copies their pages. They are the parent's, keep them.
        gc.freeze()
    from dsconf.hydra_private import restore_singletons

    restore_singletons(payload.hydra_state)
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        # A forked rank inherits torch already imported, so the variable alone would not take effect.
        sys.modules["torch"].set_num_threads(int(threads))
    if payload.cwd and os.getcwd() != payload.cwd:
        os.chdir(payload.cwd)
    _configure_rank_logging(payload.log_level)
    prepare_rank()  # DeepSpeed's op builds: the environment's ninja, a line before a build or a long wait

    from dsconf.launch import context

    deepspeed = payload.deepspeed
    if payload.deepspeed_by_world:
        deepspeed = _deepspeed_for_this_world(payload)
    context.set_job_state(deepspeed=deepspeed, job_dir=payload.job_dir, ds_config_path=payload.ds_config_path)
    if payload.init_timeout and payload.job_dir:
        guard_process_group_init(payload.init_timeout, os.path.join(payload.job_dir, "logs"))
    try:
        result = run_task(payload.task_fn, payload.cfg, payload.job_dir)
    except BaseException:
        traceback.print_exc()  # into this rank's stderr log; torch records it in rank{N}.error.json too
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return dumps(result)


def run_task(task_fn: Callable[[Any], Any], cfg: Any, job_dir: Optional[str]) -> Any:
    """The task on this rank (launched, or run in place), measured if it is a tuning trial; once it has returned, the
    process group it left up is destroyed at exit."""
    from dsconf.launch import trial_meter

    result = trial_meter.run(task_fn, cfg, job_dir)
    end_process_group_at_exit()
    return result


def _deepspeed_for_this_world(payload: RankPayload) -> dict[str, Any]:
    """The dict validated for the world that formed; rank 0 saves it as the job's ``ds_config.json``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size not in payload.deepspeed_by_world:
        raise RuntimeError(f"the job formed with world size {world_size}, outside the sizes validated before launch "
                           f"({sorted(payload.deepspeed_by_world)})")
    deepspeed = payload.deepspeed_by_world[world_size]
    if int(os.environ.get("RANK", "0")) == 0 and payload.job_dir:
        from dsconf.launch.job_export import save_ds_config

        save_ds_config(deepspeed, payload.job_dir)
    return deepspeed


def guard_process_group_init(seconds: float, log_dir: str) -> None:
    """End this rank, naming the ranks that never arrived, if ``torch.distributed.init_process_group`` (called by
    the task or by ``deepspeed.initialize``) has not returned within ``seconds``.

    The timeout torch and DeepSpeed pass to the process group also bounds every later collective, so it is left
    alone; only the wait for peers at init is bounded here.
    """
    import torch.distributed as dist

    original = getattr(dist.init_process_group, "__wrapped__", dist.init_process_group)
    rank = int(os.environ.get("RANK", "0"))
    marker = os.path.join(log_dir, f"rank{rank}.init")

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(OSError):
            os.makedirs(log_dir, exist_ok=True)
            open(marker, "w").close()
        timer = threading.Timer(seconds, _init_timed_out, args=(seconds, log_dir))
        timer.daemon = True
        timer.start()
        try:
            result = original(*args, **kwargs)
        finally:
            timer.cancel()
        with contextlib.suppress(OSError):  # every rank is past init: the marker has served
            os.remove(marker)
        return result

    dist.init_process_group = init_process_group


def _init_timed_out(seconds: float, log_dir: str) -> None:
    """Runs in the watchdog thread while the main thread waits in C code: report, then end the rank."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    absent = [r for r in range(world) if not os.path.exists(os.path.join(log_dir, f"rank{r}.init"))]
    text = (f"process-group init did not complete within {seconds:g} s (dist.init_timeout); "
            + (f"rank(s) {', '.join(map(str, absent))} never reached init" if absent
               else "every rank reached init (check the network between nodes)"))
    print(f"rank {rank}: {text}", file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # in torch elastic's format, so the launcher reports this text as the rank's error
        with contextlib.suppress(OSError), open(error_file, "w") as fh:
            json.dump({"message": {"message": f"TimeoutError: {text}",
                                   "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))}}}, fh)
    sys.stdout.flush()
    os._exit(1)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: send ``sig`` to this process when its parent dies (even by SIGKILL), so nothing is orphaned."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group ``pgid`` (a job's or an agent's: everything it started)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # its leader has not made the group yet, so it has started nothing: end it alone
        with contextlib.suppress(OSError):
            os.kill(pgid, sig)
    except OSError:
        pass


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
