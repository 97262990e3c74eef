"""One distributed job: validate once in this process, then run the task on every rank via torch elastic.

``launch(task_fn, cfg)`` is what both a single run (``@dsconf.main``) and each sweep job
(``hydra/launcher=dsconf``) call. In order:

1. read ``dist`` (``cfg.dist``, else the launcher's defaults) into a ``JobPlan``: workers per node, node
   range, rendezvous. A single-node job without an endpoint rendezvouses like ``torchrun --standalone``
   (c10d on ``localhost:0``, a fresh run id), so concurrent jobs on one host never collide;
2. resolve a copy of ``cfg`` and, if it has a ``deepspeed`` node, export the plain DeepSpeed dict for the
   job's world size (``dsconf.export.to_deepspeed``) and save it as ``ds_config.json`` in the job dir. An
   elastic node range (``dist.nnodes=MIN:MAX``) is validated for every world size it allows; each rank then
   takes the dict of the world that formed, and rank 0 saves that one;
3. start the elastic agent (``torch.distributed.launcher.api.elastic_launch``) in an *agent process* forked
   from this one, in a session and process group of its own with the ranks it starts; each rank gets RANK, LOCAL_RANK,
   WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torch, and the same payload (``_worker.RankPayload``) from us;
   their output goes to ``<job dir>/logs/rank{N}.{stdout,stderr}.log`` and, prefixed, to the console;
4. return rank 0's return value, or raise ``JobFailed`` carrying the failed ranks' error text.

This process only supervises, so it always answers: wherever the agent is stuck (even inside TCPStore's C++
client during rendezvous), ``dist.timeout`` and SIGINT/SIGTERM/SIGHUP are enforced here. The agent is asked
to stop first (SIGTERM: it terminates its ranks as torch elastic does) and, after ``STOP_GRACE_S``, its
whole process group is killed. Every end is a ``JobFailed`` subclass with a one-line headline.

This process never initialises CUDA (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, device counts through NVML), so
ranks may be forked on a GPU host.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Optional

from dsconf.errors import ConfigError, Problem, did_you_mean
from dsconf.launch import context
from dsconf.launch._worker import RankPayload, die_with_parent, dumps, kill_group, run_rank
from dsconf.schema.dist import RDZV_CONF_KEYS
from dsconf.world import parse_nnodes, resolve_nproc_per_node, visible_gpu_count

log = logging.getLogger(__name__)

START_METHODS = ("spawn", "fork", "forkserver")
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
STOP_GRACE_S = 10.0  # after asking the agent to stop: ranks reset SIGTERM to its default, so they end at once
JOIN_TIMEOUT_S = 600  # torch's rendezvous join_timeout default: how long a rendezvous may take
POLL_S = 0.2
# the scheduler's job id, the same on every node of a job and new for each job: a fresh rendezvous id per launch
JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "JOB_ID")


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
    init_timeout: float = 600.0
    rdzv_conf: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.max_nodes

    @property
    def world_sizes(self) -> list[int]:
        """Every world size the node range allows (one, unless ``dist.nnodes=MIN:MAX``)."""
        return [self.nproc_per_node * n for n in range(self.min_nodes, self.max_nodes + 1)]


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


def plan_job(dist: Mapping[str, Any], *, job_num: Optional[int] = None,
             environ: Optional[Mapping[str, str]] = None) -> JobPlan:
    """Validate ``dist`` and choose the rendezvous; raises ``ConfigError`` naming the bad key."""
    env = os.environ if environ is None else environ
    nproc = resolve_nproc_per_node(dist.get("nproc_per_node", 1))
    min_nodes, max_nodes = parse_nnodes(dist.get("nnodes", 1))
    start_method = str(dist.get("start_method") or "auto")
    if start_method == "auto":  # fork is fast and safe without GPUs; spawn keeps CUDA out of the parent
        start_method = "fork" if visible_gpu_count() == 0 else "spawn"
    if start_method not in START_METHODS:
        raise ConfigError(Problem("dist.start_method", f"{start_method!r} is not a start method",
                                  "valid: auto, " + ", ".join(START_METHODS)))
    timeout = _seconds(dist, "timeout", "give seconds, or null for no limit")
    init_timeout = _seconds(dist, "init_timeout", "give seconds") or 600.0
    rdzv_conf = rendezvous_conf(dist.get("rdzv_conf"))
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
        # every node must derive the same id without talking to the others: the user's, else the scheduler's job
        # id (new for each job); each sweep job gets its own
        if not rdzv_id:
            rdzv_id = next((f"dsconf-{env[v]}" for v in JOB_ID_VARS if env.get(v)), "")
        if not rdzv_id:
            if backend.startswith("etcd"):
                # an etcd rendezvous outlives its job: a reused id finds the last run's closed rendezvous
                raise ConfigError(Problem("dist.rdzv_id", f"is required with dist.rdzv_backend={backend} outside a "
                                          "scheduler job", "give a new id for each launch, the same on every node"))
            rdzv_id = "dsconf"  # c10d: the store lives and dies with this job's host agent
        rdzv_id += f"-{job_num}" if job_num is not None else ""
    else:
        rdzv_id = rdzv_id or uuid.uuid4().hex
    return JobPlan(
        nproc_per_node=nproc, min_nodes=min_nodes, max_nodes=max_nodes,
        node_rank=int(dist.get("node_rank") or 0), rdzv_backend=backend, rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id, max_restarts=int(dist.get("max_restarts") or 0),
        monitor_interval=float(dist.get("monitor_interval") or 0.1), start_method=start_method,
        timeout=timeout, init_timeout=init_timeout, rdzv_conf=rdzv_conf,
    )


def rendezvous_conf(conf: Any) -> dict[str, Any]:
    """``dist.rdzv_conf`` (a mapping, or torchrun's ``k=v,k=v`` text) checked against the keys torch reads."""
    if conf is None or conf == "":
        return {}
    if isinstance(conf, str):
        from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

        try:
            conf = _parse_rendezvous_config(conf)
        except ValueError as err:
            raise ConfigError(Problem("dist.rdzv_conf", str(err), "e.g. dist.rdzv_conf='join_timeout=60'")) from None
    if not isinstance(conf, Mapping):
        raise ConfigError(Problem("dist.rdzv_conf", f"{conf!r} is not a mapping",
                                  "e.g. dist.rdzv_conf.join_timeout=60"))
    unknown = [Problem(f"dist.rdzv_conf.{key}", "not a rendezvous setting torch reads",
                       did_you_mean(str(key), RDZV_CONF_KEYS)) for key in conf if key not in RDZV_CONF_KEYS]
    if unknown:
        raise ConfigError(unknown)
    return {str(k): v for k, v in conf.items()}


def _seconds(dist: Mapping[str, Any], key: str, hint: str) -> Optional[float]:
    value = dist.get(key)
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(Problem(f"dist.{key}", f"{value!r} is not a number of seconds > 0", hint))
    return seconds


def launch(task_fn: Callable[[Any], Any], cfg: Any, *, dist: Optional[Mapping[str, Any]] = None,
           job_dir: Optional[str] = None, job_num: Optional[int] = None, tee: bool = True) -> Any:
    """Run ``task_fn(cfg)`` on every rank of one distributed job and return rank 0's return value.

    ``dist`` defaults to ``dist_settings(cfg)``; ``job_dir`` to Hydra's output dir, else the working dir.
    On node ``k > 0`` of a multi-node job, there is no rank 0 here and the result is None.
    """
    # torch.cuda.is_available() (torch's, DeepSpeed's accelerator detection) then asks NVML and does not
    # initialise CUDA here, which would make every forked rank fail
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    plan = plan_job(dist if dist is not None else dist_settings(cfg), job_num=job_num)
    if plan.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: several ranks on one host must not each use every core.
        os.environ["OMP_NUM_THREADS"] = "1"
    job_dir = os.path.abspath(job_dir or _hydra_output_dir() or os.getcwd())
    payload = RankPayload(task_fn=task_fn, cfg=None, cwd=os.getcwd(), job_dir=job_dir,
                          log_level=logging.getLogger().getEffectiveLevel(), init_timeout=plan.init_timeout)
    if len(plan.world_sizes) == 1:  # validates: ConfigError before any rank
        payload.deepspeed, payload.ds_config_path = export_deepspeed(cfg, plan.world_size, job_dir)
    else:
        payload.deepspeed_by_world = export_for_world_sizes(cfg, plan.world_sizes, plan)
        if payload.deepspeed_by_world:
            payload.ds_config_path = os.path.join(job_dir, context.DS_CONFIG_FILE)  # rank 0 writes it
    payload.cfg = _resolved_copy(cfg)
    log_dir = os.path.join(job_dir, "logs")
    if plan.start_method == "fork":
        results = _supervise(plan, payload, log_dir, tee=tee)
    else:
        # ranks read the payload from a file: a large argument would make multiprocessing start them one by
        # one (the parent blocks on the pipe until each child has imported its main module)
        payload.hydra_state = _hydra_state()
        fd, path = tempfile.mkstemp(prefix="dsconf-payload-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(dumps(payload))
            results = _supervise(plan, path, log_dir, tee=tee)
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
    problems = hardware_problems(deepspeed)  # before any rank starts: a precision this host's accelerator lacks
    if problems:
        raise ConfigError(problems)
    if not job_dir:
        return deepspeed, None
    return deepspeed, save_ds_config(deepspeed, job_dir)


def export_for_world_sizes(cfg: Any, world_sizes: list[int], plan: JobPlan) -> dict[int, dict]:
    """One validated DeepSpeed dict per world size an elastic node range allows; every size's problems at once."""
    if _select(cfg, "deepspeed") is None:
        return {}
    dicts: dict[int, dict] = {}
    problems: list[Problem] = []
    for world_size in world_sizes:
        try:
            dicts[world_size] = export_deepspeed(cfg, world_size, None)[0]  # type: ignore[assignment]
        except ConfigError as err:
            if len(world_sizes) == 1:  # a fixed world: the problems as a single run reports them
                raise
            nodes = world_size // plan.nproc_per_node
            problems += [Problem(p.path, f"with {nodes} node(s) of dist.nnodes={plan.min_nodes}:{plan.max_nodes} "
                                 f"(world size {world_size}): {p.message}", p.hint)
                         for p in err.problems if p not in problems]
    if problems:
        raise ConfigError(problems)
    return dicts


def save_ds_config(deepspeed: dict, job_dir: str) -> str:
    os.makedirs(job_dir, exist_ok=True)
    path = os.path.join(job_dir, context.DS_CONFIG_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(deepspeed, fh, indent=2)
        fh.write("\n")
    return path


def _supervise(plan: JobPlan, arg: Any, log_dir: str, *, tee: bool) -> dict[int, Any]:
    """Run the elastic agent in its own session and wait for it, enforcing ``dist.timeout`` and signals."""
    import dsconf.launch._compat  # noqa: F401  (torch elastic imported once, before the fork)

    receiver, sender = multiprocessing.Pipe(duplex=False)
    agent = multiprocessing.get_context("fork").Process(target=_agent_process, args=(sender, plan, arg, log_dir, tee),
                                                        name="dsconf-agent", daemon=False)
    started = time.monotonic()
    deadline = started + plan.timeout if plan.timeout else None
    # torch bounds a rendezvous by join_timeout, except where its store client is stuck in C++: enforced here too
    join_timeout = float(plan.rdzv_conf.get("join_timeout") or JOIN_TIMEOUT_S)
    join_deadline: Optional[float] = started + join_timeout + STOP_GRACE_S
    stop: Optional[JobFailed] = None
    kill_at: Optional[float] = None
    message: Any = None
    with _signals_caught() as caught:
        agent.start()
        sender.close()
        try:
            open_pipe = True
            while open_pipe or agent.is_alive():
                wait(([receiver] if open_pipe else []) + [agent.sentinel], POLL_S)
                while open_pipe and receiver.poll():
                    try:
                        kind, value = pickle.loads(receiver.recv_bytes())
                    except (EOFError, OSError):
                        open_pipe = False  # the agent is gone
                        break
                    if kind == "started":
                        join_deadline = None
                    else:
                        message, open_pipe = value, False
                now = time.monotonic()
                if stop is None and caught:
                    name = signal.Signals(caught[0]).name
                    stop = JobInterrupted(f"job stopped by {name}; every rank was terminated", log_dir=log_dir)
                elif stop is None and deadline is not None and now > deadline:
                    stop = JobTimeout(f"job timed out after {plan.timeout:g} s (dist.timeout); every rank was "
                                      "terminated", log_dir=log_dir)
                elif stop is None and join_deadline is not None and now > join_deadline:
                    stop = JobTimeout(f"rendezvous at {plan.rdzv_endpoint} did not complete within {join_timeout:g} s "
                                      "(dist.rdzv_conf.join_timeout); is something else listening there?",
                                      log_dir=log_dir)
                if stop is not None and kill_at is None:
                    kill_at = now + STOP_GRACE_S
                    with contextlib.suppress(OSError):
                        os.kill(agent.pid, signal.SIGTERM)  # the agent terminates its ranks, as torch elastic does
                if kill_at is not None and now > kill_at:
                    kill_group(agent.pid)
                    open_pipe = False
        finally:
            kill_group(agent.pid)  # whatever the agent left behind, or everything if we are interrupted
            agent.join()
            receiver.close()
    if stop is not None:
        raise stop
    if isinstance(message, BaseException):
        raise message
    if message is None:
        raise JobFailed(f"the elastic agent exited with code {agent.exitcode} before reporting; rank logs: {log_dir}",
                        log_dir=log_dir)
    return message


def _agent_process(conn: Connection, plan: JobPlan, arg: Any, log_dir: str, tee: bool) -> None:
    """Body of the agent process: torch elastic's agent starts the ranks; the outcome goes back over ``conn``."""
    # A session of its own, as torchrun's ranks have: Linux's autogroup scheduler then no longer counts the ranks
    # with the launcher's session (in it, HF Trainer's samples/s on 2 CPUs was 0.90x to 0.96x torchrun's). Its
    # process group is the agent's pid: the ranks join it, and one killpg ends everything the job started.
    with contextlib.suppress(OSError):
        os.setsid()
    die_with_parent(signal.SIGKILL)
    # not the launcher's flag-setting handlers: until torch elastic installs its own, a stop request ends the agent
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # torch logs each failed rank with the agent's own traceback; the launcher reports the rank's error instead
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)

    def started() -> None:
        with contextlib.suppress(OSError):
            conn.send_bytes(pickle.dumps(("started", None)))

    try:
        outcome: Any = _run_elastic(plan, arg, log_dir, tee=tee, on_start=started)
    except JobFailed as err:
        outcome = err
    except BaseException as err:  # rendezvous and store errors: one line, no traceback
        outcome = _agent_failed(err, plan, log_dir)
    try:
        conn.send_bytes(pickle.dumps(("outcome", outcome)))
    except Exception as err:  # pragma: no cover - results are bytes already
        conn.send_bytes(pickle.dumps(("outcome", JobFailed(f"could not report the job's outcome: {err}"))))
    conn.close()


def launch_config(plan: JobPlan, log_dir: str, *, tee: bool = True,
                  on_start: Optional[Callable[[], None]] = None) -> Any:
    """torch elastic's ``LaunchConfig`` for ``plan``, as torchrun builds it from its flags."""
    from dsconf.launch._compat import make_launch_config

    rdzv_configs: dict[str, Any] = dict(plan.rdzv_conf)  # torchrun's --rdzv-conf
    if plan.rdzv_backend == "static":
        rdzv_configs.setdefault("rank", plan.node_rank)
    return make_launch_config(
        log_dir=log_dir, tee=tee, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
        nproc_per_node=plan.nproc_per_node, run_id=plan.rdzv_id, rdzv_backend=plan.rdzv_backend,
        rdzv_endpoint=plan.rdzv_endpoint, rdzv_configs=rdzv_configs, max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval, start_method=plan.start_method, role="dsconf", on_start=on_start,
    )


def _run_elastic(plan: JobPlan, arg: Any, log_dir: str, *, tee: bool,
                 on_start: Optional[Callable[[], None]] = None) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    try:
        return elastic_launch(launch_config(plan, log_dir, tee=tee, on_start=on_start), run_rank)(arg)
    except ChildFailedError as err:
        raise _job_failed(err, log_dir) from None
    except SignalException as err:
        raise JobInterrupted(f"job stopped by {err.sigval.name}; every rank was terminated",
                             log_dir=log_dir) from None


def _agent_failed(err: BaseException, plan: JobPlan, log_dir: str) -> JobFailed:
    """An error of the agent itself (rendezvous, store, network) as a one-line ``JobFailed``."""
    text = " ".join(str(err).split()) or type(err).__name__
    module = type(err).__module__ or ""
    if "rendezvous" in module or "Dist" in type(err).__name__ or isinstance(err, (OSError, TimeoutError)):
        where = f"rendezvous at {plan.rdzv_endpoint} ({plan.rdzv_backend}, id {plan.rdzv_id}) failed"
        return JobFailed(f"{where}: {type(err).__name__}: {_short(text)}", log_dir=log_dir)
    return JobFailed(f"the elastic agent failed: {type(err).__name__}: {_short(text)}", log_dir=log_dir)


@contextlib.contextmanager
def _signals_caught() -> Iterator[list[int]]:
    """SIGINT/SIGTERM/SIGHUP recorded (not raised) while the job runs, so the job is stopped in order."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def on_signal(signum: int, frame: Any) -> None:
        if not caught:
            print(f"dsconf: got {signal.Signals(signum).name}, stopping every rank", file=sys.stderr, flush=True)
        caught.append(signum)

    saved = {}
    for name in STOP_SIGNALS:
        signum = getattr(signal, name)
        saved[signum] = signal.signal(signum, on_signal)
    try:
        yield caught
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _short(text: str, width: int = 240) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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
