"""One distributed job: validate once in this process, then run the task on every rank via torch elastic.

``launch(task_fn, cfg)`` is what both a single run (``@dsconf.main``) and each sweep job
(``hydra/launcher=dsconf``) call. In order:

1. read ``dist`` (``cfg.dist``, else the launcher's defaults) into a ``JobPlan``: workers per node, node
   range, rendezvous. A single-node job without an endpoint rendezvouses like ``torchrun --standalone``
   (c10d on ``localhost:0``, a fresh run id), so concurrent jobs on one host never collide;
2. resolve a copy of ``cfg`` and, if it has a ``deepspeed`` node, export the plain DeepSpeed dict for the
   job's world size (``dsconf.export.to_deepspeed``) and save it as ``ds_config.json`` in the job dir;
3. start ``nproc_per_node`` workers through ``torch.distributed.launcher.api.elastic_launch``; each gets
   RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torch, and the same payload
   (``_worker.RankPayload``) from us; their output goes to ``<job dir>/logs/rank{N}.{stdout,stderr}.log``
   and, prefixed, to the console;
4. return rank 0's return value, or raise ``JobFailed`` carrying the failed ranks' error text.

``dist.timeout`` ends a job that runs too long: a SIGALRM in this (main) thread raises ``JobTimeout``
inside torch elastic's monitor loop, whose cleanup terminates every worker. SIGINT/SIGTERM are handled
by torch elastic the same way (it stops all workers, then we raise ``JobInterrupted``); this module
restores the process's own signal handlers afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from dsconf.errors import ConfigError, Problem
from dsconf.launch import context
from dsconf.launch._worker import RankPayload, dumps, run_rank
from dsconf.world import parse_nnodes, resolve_nproc_per_node, visible_gpu_count

log = logging.getLogger(__name__)

START_METHODS = ("spawn", "fork", "forkserver")
HANDLED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


class JobFailed(RuntimeError):
    """A distributed job did not complete; ``failures`` maps each failed global rank to its error text."""

    def __init__(self, message: str, failures: Optional[Mapping[int, str]] = None,
                 log_dir: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.failures = dict(failures or {})
        self.log_dir = log_dir

    def __reduce__(self) -> Any:
        return type(self), (self.message, self.failures, self.log_dir)

    @property
    def headline(self) -> str:
        return self.message.splitlines()[0] if self.message else type(self).__name__


class JobTimeout(JobFailed):
    """The job ran past ``dist.timeout`` and every rank was stopped."""


class JobInterrupted(JobFailed):
    """SIGINT/SIGTERM stopped the job and every rank."""


@dataclass(frozen=True)
class JobPlan:
    """``dist`` resolved into what one node's elastic agent needs."""

    nproc_per_node: int
    min_nodes: int
    max_nodes: int
    node_rank: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int
    monitor_interval: float
    start_method: str
    timeout: Optional[float]

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.max_nodes


def dist_settings(cfg: Any = None, defaults: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The job's ``dist`` settings: ``DistConfig`` defaults, then ``defaults`` (the launcher's), then ``cfg.dist``."""
    from omegaconf import DictConfig, OmegaConf

    from dsconf.schema.dist import DistConfig

    merged = asdict(DistConfig())
    for layer in (defaults, _select(cfg, "dist")):
        if layer is None:
            continue
        if isinstance(layer, DictConfig):
            layer = OmegaConf.to_container(layer, resolve=True)
        merged.update({k: v for k, v in dict(layer).items()})
    return merged


def plan_job(dist: Mapping[str, Any], *, job_num: Optional[int] = None) -> JobPlan:
    """Validate ``dist`` and choose the rendezvous; raises ``ConfigError`` naming the bad key."""
    nproc = resolve_nproc_per_node(dist.get("nproc_per_node", 1))
    min_nodes, max_nodes = parse_nnodes(dist.get("nnodes", 1))
    start_method = str(dist.get("start_method") or "auto")
    if start_method == "auto":  # fork is fast and safe without GPUs; spawn keeps CUDA out of the parent
        start_method = "fork" if visible_gpu_count() == 0 else "spawn"
    if start_method not in START_METHODS:
        raise ConfigError(Problem("dist.start_method", f"{start_method!r} is not a start method",
                                  "valid: auto, " + ", ".join(START_METHODS)))
    timeout = dist.get("timeout")
    if timeout is not None and float(timeout) <= 0:
        raise ConfigError(Problem("dist.timeout", f"{timeout} is not > 0", "give seconds, or null for no limit"))
    endpoint = str(dist.get("rdzv_endpoint") or "").strip()
    backend = str(dist.get("rdzv_backend") or "c10d")
    rdzv_id = str(dist.get("rdzv_id") or "")
    if max_nodes == 1 and not endpoint:
        # like torchrun --standalone: c10d on a free local port, a fresh run id
        backend, endpoint, rdzv_id = "c10d", "localhost:0", rdzv_id or uuid.uuid4().hex
    elif not endpoint:
        raise ConfigError(Problem("dist.rdzv_endpoint", f"is required when dist.nnodes={dist.get('nnodes')!r}",
                                  "give the same host:port on every node, e.g. dist.rdzv_endpoint=node0:29400"))
    elif max_nodes > 1:
        # every node derives the same id without talking to the others; each sweep job gets its own
        rdzv_id = (rdzv_id or "dsconf") + (f"-{job_num}" if job_num is not None else "")
    else:
        rdzv_id = rdzv_id or uuid.uuid4().hex
    return JobPlan(
        nproc_per_node=nproc, min_nodes=min_nodes, max_nodes=max_nodes,
        node_rank=int(dist.get("node_rank") or 0), rdzv_backend=backend, rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id, max_restarts=int(dist.get("max_restarts") or 0),
        monitor_interval=float(dist.get("monitor_interval") or 0.1), start_method=start_method,
        timeout=float(timeout) if timeout is not None else None,
    )


def launch(task_fn: Callable[[Any], Any], cfg: Any, *, dist: Optional[Mapping[str, Any]] = None,
           job_dir: Optional[str] = None, job_num: Optional[int] = None, tee: bool = True) -> Any:
    """Run ``task_fn(cfg)`` on every rank of one distributed job and return rank 0's return value.

    ``dist`` defaults to ``dist_settings(cfg)``; ``job_dir`` to Hydra's output dir, else the working dir.
    On node ``k > 0`` of a multi-node job, there is no rank 0 here and the result is None.
    """
    plan = plan_job(dist if dist is not None else dist_settings(cfg), job_num=job_num)
    if plan.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: several ranks on one host must not each use every core.
        os.environ["OMP_NUM_THREADS"] = "1"
    job_dir = os.path.abspath(job_dir or _hydra_output_dir() or os.getcwd())
    deepspeed, ds_path = export_deepspeed(cfg, plan.world_size, job_dir)  # validates: ConfigError before any rank
    resolved = _resolved_copy(cfg)
    payload = RankPayload(task_fn=task_fn, cfg=resolved, cwd=os.getcwd(), job_dir=job_dir, deepspeed=deepspeed,
                          ds_config_path=ds_path, log_level=logging.getLogger().getEffectiveLevel())
    log_dir = os.path.join(job_dir, "logs")
    if plan.start_method == "fork":
        # the agent must not initialise CUDA before forking ranks (torch.cuda.is_available() would)
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        results = _run_elastic(plan, payload, log_dir, tee=tee)
    else:
        # ranks read the payload from a file: a large argument would make multiprocessing start them one by
        # one (the parent blocks on the pipe until each child has imported its main module)
        payload.hydra_state = _hydra_state()
        fd, path = tempfile.mkstemp(prefix="dsconf-payload-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(dumps(payload))
            results = _run_elastic(plan, path, log_dir, tee=tee)
        finally:
            os.remove(path)
    value = results.get(0)
    return pickle.loads(value) if value is not None else None


def export_deepspeed(cfg: Any, world_size: int, job_dir: Optional[str]) -> tuple[Optional[dict], Optional[str]]:
    """The plain DeepSpeed dict for ``world_size`` ranks and the ``ds_config.json`` it was saved to."""
    if _select(cfg, "deepspeed") is None:
        return None, None
    from dsconf.export import to_deepspeed
    from dsconf.hardware import hardware_problems

    deepspeed = to_deepspeed(cfg, world_size=world_size)
    problems = hardware_problems(deepspeed)  # before any rank starts: a GPU-only precision on a CPU host
    if problems:
        raise ConfigError(problems)
    if not job_dir:
        return deepspeed, None
    os.makedirs(job_dir, exist_ok=True)
    path = os.path.join(job_dir, context.DS_CONFIG_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(deepspeed, fh, indent=2)
        fh.write("\n")
    return deepspeed, path


def _run_elastic(plan: JobPlan, arg: Any, log_dir: str, *, tee: bool) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from dsconf.launch._compat import make_launch_config

    rdzv_configs: dict[str, Any] = {"rank": plan.node_rank} if plan.rdzv_backend == "static" else {}
    config = make_launch_config(
        log_dir=log_dir, tee=tee, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
        nproc_per_node=plan.nproc_per_node, run_id=plan.rdzv_id, rdzv_backend=plan.rdzv_backend,
        rdzv_endpoint=plan.rdzv_endpoint, rdzv_configs=rdzv_configs, max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval, start_method=plan.start_method, role="dsconf",
    )
    try:
        with _own_signal_handlers(), _deadline(plan.timeout, log_dir):
            return elastic_launch(config, run_rank)(arg)
    except ChildFailedError as err:
        raise _job_failed(err, log_dir) from None
    except SignalException as err:
        raise JobInterrupted(f"job stopped by {err.sigval.name}; every rank was terminated",
                             log_dir=log_dir) from None


@contextlib.contextmanager
def _deadline(seconds: Optional[float], log_dir: str) -> Iterator[None]:
    """Raise ``JobTimeout`` in this thread after ``seconds`` (main thread only: it uses SIGALRM)."""
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        log.warning("dist.timeout is enforced only when the job is launched from the main thread")
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise JobTimeout(f"job timed out after {seconds:g} s (dist.timeout); every rank was terminated",
                         log_dir=log_dir)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """torch elastic installs handlers for SIGINT/SIGTERM/... and never removes them: put ours back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {name: signal.getsignal(getattr(signal, name)) for name in HANDLED_SIGNALS if hasattr(signal, name)}
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)


def _job_failed(err: Any, log_dir: str) -> JobFailed:
    """``ChildFailedError`` as a ``JobFailed`` whose message leads with the root-cause rank's exception.

    torch reports the first failed worker it notices, which may be a rank that only saw its peer die; every
    rank that raised left ``rank{N}.error.json`` in the log dir, and the earliest of those is the root cause.
    """
    texts = {rank: f"{_message(f.message)[0]} (exit code {f.exitcode}, pid {f.pid})"
             for rank, f in sorted(err.failures.items())}
    raised: dict[int, tuple[float, str, str]] = {}
    for path in Path(log_dir).glob("rank*.error.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            message, trace = _message(json.loads(path.read_text())["message"])
            raised[int(path.name.split(".")[0][4:])] = (path.stat().st_mtime, message, trace)
    for rank, (_, message, _) in raised.items():
        texts.setdefault(rank, message)
    root = min(raised, key=lambda r: raised[r][0]) if raised else min(texts)
    lines = [f"rank {root} failed: {texts[root]}"]
    if root in raised and raised[root][2]:
        lines.append(raised[root][2].rstrip())
    lines += [f"rank {r} failed: {t}" for r, t in sorted(texts.items()) if r != root]
    lines.append(f"rank logs: {log_dir}")
    return JobFailed("\n".join(lines), failures=texts, log_dir=log_dir)


def _message(message: Any) -> tuple[str, str]:
    """(text, traceback) of an error-file message as torch's ``record`` writes it."""
    if isinstance(message, dict):
        return str(message.get("message", "")), str(message.get("extraInfo", {}).get("py_callstack", ""))
    return str(message), ""


def _resolved_copy(cfg: Any) -> Any:
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


def _select(cfg: Any, key: str) -> Any:
    if cfg is None:
        return None
    if isinstance(cfg, Mapping):
        return cfg.get(key)
    try:
        return cfg[key] if key in cfg else None
    except Exception:
        return None


def _hydra_output_dir() -> Optional[str]:
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.output_dir


def _hydra_state() -> Any:
    if "hydra" not in sys.modules:
        return None
    from hydra.core.singleton import Singleton

    return Singleton.get_state()
