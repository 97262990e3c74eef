"""A sweep's jobs, each a distributed job: ordering, parallel packing, failures, interrupts, the summary.

Each job runs in a *job process* forked from the launcher: it calls Hydra's ``run_job`` (so output dirs,
``.hydra/`` files, job numbering and callbacks are exactly the basic launcher's) with a task that starts the
job's ranks through ``core.launch``, then sends the ``JobReturn`` back over a pipe. Inside it, ``core.launch``
does what it does for a single run: the elastic agent runs in an agent process of its own session, which the
job process supervises (``supervisor``), enforcing ``dist.timeout`` and stopping the agent and its ranks on
SIGTERM. The agent and the ranks die with their parent (``die_with_parent``), so killing a job process ends
every rank of its job. Forking keeps the launcher's state — the task function, closures, registered resolvers,
Hydra's singletons — and torch, imported once here before the first fork.

- ``max_parallel_jobs > 1`` runs that many job processes at once; with GPUs each gets its own
  ``CUDA_VISIBLE_DEVICES`` subset of ``nproc_per_node`` devices, and a job waits until enough are free.
  A job with a fixed ``dist.rdzv_endpoint`` (every multi-node job) runs alone: a second job would join the
  first one's rendezvous store.
- A failed job is FAILED with its error (the failing rank's exception); the others still run unless
  ``fail_fast``, which stops the running jobs and skips the rest.
- SIGINT/SIGTERM to the launcher: every running job process gets SIGTERM (its supervisor stops the agent
  and the ranks, and the job is reported FAILED); a job process still alive ``JOB_STOP_GRACE_S`` later is
  SIGKILLed, which ends its agent and ranks too. Pending jobs are skipped. A job past its ``dist.timeout`` is
  stopped by its own supervisor; the same grace after it, the launcher kills a job process that did not end.
- At the end of each batch the summary table (job, overrides, status, wall time, result or error, and one
  column per metric the jobs left behind) is printed and written to ``<sweep dir>/summary.md`` and
  ``summary.json`` (all batches so far); ``dsconf.launch.report`` writes and reads them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Optional

from dsconf.launch._worker import die_with_parent, dumps, kill_group
from dsconf.launch.hydra_support import DSCONF_TASK_ATTR, task_cfg
from dsconf.launch.rank_setup import SharedCpuInfo
from dsconf.launch.report import JobRecord, format_table, job_metrics, write_summary
from dsconf.launch.sweep_check import ComposedJobs

log = logging.getLogger(__name__)

POLL_S = 0.2
# After SIGTERM (or past its dist.timeout), how long a job process may take to end before it is SIGKILLed. Its own
# supervisor stops the agent and the ranks within supervisor.AGENT_STOP_GRACE_S (10 s); then Hydra's run_job ends
# the job (callbacks, .hydra/ files) and the job process reports FAILED. 40 s leaves that orderly end 30 s of room
# on a loaded host: the kill is for a job process that is stuck itself.
JOB_STOP_GRACE_S = 40.0


@dataclass
class LauncherOptions:
    max_parallel_jobs: int = 1
    fail_fast: bool = False
    dist: dict[str, Any] = field(default_factory=dict)  # defaults for task configs without a ``dist`` node
    summary: bool = True


@dataclass
class _Job:
    record: JobRecord
    sweep_config: Any
    nproc: int
    timeout: Optional[float]
    exclusive: bool = False  # its rendezvous endpoint is fixed, so it never shares the host
    process: Any = None
    conn: Optional[Connection] = None
    started: float = 0.0
    started_at: float = 0.0  # wall clock (time.time()): a metrics.json older than this is an earlier run's
    devices: Optional[list[str]] = None
    stop_sent: float = 0.0
    kill_at: Optional[float] = None
    ret: Any = None


class SweepRunner:
    """Runs the jobs of each ``launch`` call (one sweep batch) and keeps the summary across batches."""

    def __init__(self, *, hydra_context: Any, task_function: Callable[[Any], Any], config: Any,
                 options: LauncherOptions) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config
        self.options = options
        self.records: list[JobRecord] = []
        self._signal: Optional[int] = None
        self.composed_jobs = ComposedJobs()  # jobs the command line's sweep check composed already
        self.cpu_info: Optional[SharedCpuInfo] = None  # one answer for every rank of the sweep, every batch

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
        from hydra.core.utils import configure_log, filter_overrides, setup_globals
        from omegaconf import open_dict

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs with dsconf (at most {self.options.max_parallel_jobs} at once)")
        _import_torch_elastic()
        jobs = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = (self.composed_jobs.take(list(overrides))
                            or self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides)))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            jobs.append(self._job(idx, list(overrides), sweep_config))
        returns = self._run(jobs)
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        self.records += [job.record for job in jobs]
        if self.options.summary:
            write_summary(self.records, sweep_dir)
            print(format_table([job.record for job in jobs]), flush=True)
        if self._signal is not None:
            raise SystemExit(128 + self._signal)
        return returns

    def _job(self, idx: int, overrides: list[str], sweep_config: Any) -> _Job:
        from dsconf.launch.plan import dist_settings
        from dsconf.world import parse_nnodes, resolve_nproc_per_node

        try:
            dist = dist_settings(task_cfg(sweep_config), self.options.dist)
            nproc, timeout = resolve_nproc_per_node(dist.get("nproc_per_node", 1)), dist.get("timeout")
            exclusive = parse_nnodes(dist.get("nnodes", 1))[1] > 1 or bool(str(dist.get("rdzv_endpoint") or "").strip())
        except Exception:  # the job process reports the config error properly
            nproc, timeout, exclusive = 1, None, False
        return _Job(JobRecord(idx, overrides), sweep_config, nproc, float(timeout) if timeout else None, exclusive)

    def _run(self, jobs: list[_Job]) -> list[Any]:
        pending, running = deque(jobs), []
        devices = DevicePool.detect() if self.options.max_parallel_jobs > 1 else DevicePool([])
        stopping = False
        if self.cpu_info is None:
            self.cpu_info = SharedCpuInfo()
        with self._catch_signals(), self.cpu_info.named():
            while pending or running:
                if not stopping and (self._signal is not None or (self.options.fail_fast and _any_failed(jobs))):
                    stopping = True
                    for job in running:
                        self._stop(job)
                    while pending:
                        _skip(pending.popleft(), "interrupted" if self._signal is not None else "fail_fast")
                while pending and len(running) < self.options.max_parallel_jobs:
                    if running and (pending[0].exclusive or any(job.exclusive for job in running)):
                        break
                    assigned = devices.take(pending[0].nproc)
                    if assigned is None:
                        break
                    job = pending.popleft()
                    self._start(job, assigned)
                    running.append(job)
                if running:
                    wait([j.conn for j in running if j.conn] + [j.process.sentinel for j in running], POLL_S)
                for job in list(running):
                    if self._poll(job):
                        running.remove(job)
                        devices.give(job.devices)
        return [job.ret for job in jobs]

    def _start(self, job: _Job, devices: list[str]) -> None:
        receiver, sender = multiprocessing.Pipe(duplex=False)
        job.devices = devices
        job.conn = receiver
        job.process = multiprocessing.get_context("fork").Process(
            target=_job_process, name=f"dsconf-job-{job.record.job}", daemon=False,
            args=(sender, self.hydra_context, self.task_function, job.sweep_config, self.options.dist,
                  job.record.job, devices),
        )
        job.started, job.started_at = time.monotonic(), time.time()
        job.record.status = "RUNNING"
        job.process.start()
        sender.close()
        with contextlib.suppress(OSError, AttributeError):
            os.setpgid(job.process.pid, job.process.pid)  # also done by the child: no race
        if job.timeout:
            job.kill_at = job.started + job.timeout + JOB_STOP_GRACE_S

    def _poll(self, job: _Job) -> bool:
        """Collect what the job process sent; True once it has ended and the job is settled."""
        self._receive(job)
        now = time.monotonic()
        if job.kill_at is not None and now > job.kill_at and job.process.is_alive():
            # its agent and ranks get the parent-death signal (die_with_parent) when it dies: they are not in its
            # group, since the agent runs in a session of its own
            log.error(f"job #{job.record.job} did not stop in time; killing it")
            kill_group(job.process.pid)
        if job.process.is_alive():
            return False
        job.process.join()
        self._receive(job)  # it may have sent its result just before exiting
        assert job.conn is not None
        job.conn.close()
        if job.ret is None:
            from dsconf.launch.failures import JobFailed

            code = job.process.exitcode
            error = JobFailed(f"job process exited with code {code} before reporting a result")
            job.ret = _failed_return(job.sweep_config, job.record.overrides, error)
        _settle(job, now)
        return True

    @staticmethod
    def _receive(job: _Job) -> None:
        assert job.conn is not None
        if job.ret is None and job.conn.poll():
            with contextlib.suppress(EOFError, OSError):
                job.ret = _loads_return(job.conn.recv_bytes())

    def _stop(self, job: _Job) -> None:
        """SIGTERM the job process: its elastic agent terminates every rank, then it reports FAILED."""
        with contextlib.suppress(OSError, AttributeError):
            os.kill(job.process.pid, signal.SIGTERM)
        job.kill_at = min(job.kill_at or float("inf"), time.monotonic() + JOB_STOP_GRACE_S)

    @contextlib.contextmanager
    def _catch_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self._signal is None:
                print(f"dsconf: got {signal.Signals(signum).name}, stopping every running job", file=sys.stderr)
            self._signal = signum

        saved = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)


class DevicePool:
    """GPU ids handed to concurrently running jobs, ``nproc_per_node`` each (no GPUs: no constraint)."""

    def __init__(self, ids: list[str]) -> None:
        self.total = list(ids)
        self.free = list(ids)

    @classmethod
    def detect(cls) -> DevicePool:
        from dsconf.world import parse_visible_devices

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:  # as CUDA reads it: the ids (ordinals or UUIDs) before the first invalid entry
            return cls([str(d) for d in parse_visible_devices(visible)])
        import torch

        return cls([str(i) for i in range(torch.cuda.device_count())])  # NVML count: does not poison fork

    def take(self, n: int) -> Optional[list[str]]:
        if not self.total:
            return []
        n = min(n, len(self.total))
        if len(self.free) < n:
            return None
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def give(self, ids: Optional[list[str]]) -> None:
        self.free += [i for i in ids or [] if i in self.total and i not in self.free]


def _job_process(conn: Connection, hydra_context: Any, task_function: Callable[[Any], Any], sweep_config: Any,
                 dist_defaults: dict[str, Any], job_num: int, devices: list[str]) -> None:
    """Body of a job process (forked): run the job through Hydra's ``run_job`` and send back its ``JobReturn``."""
    from hydra.core.utils import run_job

    with contextlib.suppress(OSError, AttributeError):
        os.setpgid(0, 0)
    die_with_parent(signal.SIGTERM)
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the launcher's flag-setting handler
    signal.signal(signal.SIGTERM, _interrupted)
    task = functools.wraps(task_function)(functools.partial(_distributed_task, task_function, dist_defaults, job_num))
    ret = run_job(hydra_context=hydra_context, task_function=task, config=sweep_config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    conn.send_bytes(_dumps_return(ret))
    conn.close()


def _distributed_task(task_function: Callable[[Any], Any], dist_defaults: dict[str, Any], job_num: int,
                      cfg: Any) -> Any:
    from dsconf.launch.core import launch
    from dsconf.launch.plan import dist_settings

    task_fn = getattr(task_function, DSCONF_TASK_ATTR, task_function)
    return launch(task_fn, cfg, dist=dist_settings(cfg, dist_defaults), job_num=job_num)


def _interrupted(signum: int, frame: Any) -> None:
    from dsconf.launch.failures import JobInterrupted

    raise JobInterrupted(f"job stopped by {signal.Signals(signum).name}")


def _settle(job: _Job, now: float) -> None:
    from hydra.core.utils import JobStatus

    record, ret = job.record, job.ret
    record.wall_s = round(now - job.started, 3)
    record.job_dir = str(Path(ret.hydra_cfg.hydra.runtime.output_dir)) if _has_output_dir(ret) else ""
    completed = ret.status == JobStatus.COMPLETED
    job_dir = Path(record.job_dir) if record.job_dir else None
    # a failed job's metrics.json still counts: how far it got is worth a column
    record.metrics = job_metrics(ret._return_value if completed else None, job_dir, since=job.started_at)
    if completed:
        record.status, record.result = "COMPLETED", _short(repr(ret._return_value))
        log.info(f"job #{record.job} completed in {record.wall_s:.1f} s")
    else:
        error = ret._return_value
        text = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        record.status, record.error = "FAILED", str(text)
        record.result = _short(str(text).strip().splitlines()[0] if str(text).strip() else type(error).__name__)
        log.error(f"job #{record.job} FAILED after {record.wall_s:.1f} s: {record.result}")


def _skip(job: _Job, why: str) -> None:
    from dsconf.launch.failures import JobFailed

    job.record.status, job.record.result = "SKIPPED", f"not run ({why})"
    job.ret = _failed_return(job.sweep_config, job.record.overrides, JobFailed(f"job not run ({why})"))


def _any_failed(jobs: list[_Job]) -> bool:
    return any(job.record.status == "FAILED" for job in jobs)


def _failed_return(sweep_config: Any, overrides: list[str], error: BaseException) -> Any:
    """A FAILED ``JobReturn`` for a job whose process could not report one itself."""
    from hydra.core.utils import JobReturn, JobStatus

    ret = JobReturn(overrides=list(overrides), cfg=task_cfg(sweep_config), hydra_cfg=copy.deepcopy(sweep_config),
                    status=JobStatus.FAILED)
    ret.return_value = error
    return ret


def _dumps_return(ret: Any) -> bytes:
    """The ``JobReturn``; an unpicklable return value travels as its repr, an error as its text."""
    try:
        return dumps(ret)
    except Exception as err:
        from dsconf.launch.failures import JobFailed

        log.warning(f"the job's return value cannot be pickled ({err}); sending its repr")
        value = ret._return_value
        ret._return_value = JobFailed(str(value)) if isinstance(value, BaseException) else repr(value)
        return dumps(ret)


def _loads_return(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


def _has_output_dir(ret: Any) -> bool:
    try:
        return bool(ret.hydra_cfg.hydra.runtime.output_dir)
    except Exception:
        return False


def _short(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _import_torch_elastic() -> None:
    """Import torch elastic once in the launcher, so forked job processes start without the import cost."""
    import dsconf.launch._compat  # noqa: F401
    import dsconf.launch.core  # noqa: F401
