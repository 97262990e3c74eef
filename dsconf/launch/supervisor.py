"""The elastic agent of one job, run in a process of its own and supervised from the launching process.

The agent (torch elastic's ``elastic_launch``) runs in an *agent process* forked from the launcher, in a session
and process group of its own with the ranks it starts. The launching process only waits, so it always answers:
wherever the agent is stuck (even inside TCPStore's C++ client during rendezvous), ``dist.timeout``, the
rendezvous's ``join_timeout`` and SIGINT/SIGTERM/SIGHUP are enforced here. The agent is asked to stop first
(SIGTERM: it terminates its ranks, as torch elastic does) and, ``AGENT_STOP_GRACE_S`` later, its whole process
group is killed. The agent reports back over a pipe: once when its ranks started, then its outcome (rank 0's
pickled return value, or a ``JobFailed``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from dsconf.launch._worker import die_with_parent, kill_group, run_rank
from dsconf.launch.failures import JobFailed, JobInterrupted, JobTimeout, agent_failed, job_failed
from dsconf.launch.plan import JobPlan
from dsconf.launch.rank_setup import shared_cpu_info_file

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
# After asking the agent to stop, how long before its process group is killed. Ranks reset SIGTERM to its default
# (``_worker.run_rank``), so they end as soon as the agent terminates them; 10 s is for the agent itself to notice
# on a loaded host, and is well under the 30 s torch elastic would wait for a rank that ignores SIGTERM.
AGENT_STOP_GRACE_S = 10.0
POLL_S = 0.2
# While a job starts (until rank 0 first prints, at most SILENT_WATCH_S), a line whenever its ranks have printed
# nothing for SILENT_S, counted from the command's start for the first job of a process, from the job's start for the
# next jobs of a sweep: nobody waits over 10 s without a word while imports, the rendezvous and DeepSpeed's engine
# set-up run. Once the task prints, its pace is its own.
SILENT_S = 7.0
SILENT_WATCH_S = 120.0
_jobs_supervised = 0  # in this process


def supervise(plan: JobPlan, arg: Any, log_dir: str, *, tee: bool) -> dict[int, Any]:
    """Run the elastic agent in its own session and wait for it, enforcing ``dist.timeout`` and signals.

    ``arg`` is what every rank's ``run_rank`` gets (the payload, or the path of its file). Returns each local
    rank's pickled return value; raises ``JobFailed`` (``JobTimeout``, ``JobInterrupted``) otherwise.
    """
    import dsconf.launch._compat  # noqa: F401  (torch elastic imported once, before the fork)

    receiver, sender = multiprocessing.Pipe(duplex=False)
    agent = multiprocessing.get_context("fork").Process(target=_agent_process, args=(sender, plan, arg, log_dir, tee),
                                                        name="dsconf-agent", daemon=False)
    started = time.monotonic()
    silence = SilenceNotice(log_dir, since=started - (process_age() if _jobs_supervised == 0 else 0.0))
    _count_job()
    deadline = started + plan.timeout if plan.timeout else None
    # torch bounds a rendezvous by join_timeout, except where its store client is stuck in C++: enforced here too
    join_deadline: Optional[float] = started + plan.join_timeout + AGENT_STOP_GRACE_S
    stop: Optional[JobFailed] = None
    kill_at: Optional[float] = None
    message: Any = None
    with _signals_caught() as caught, shared_cpu_info_file():  # the ranks' environment is the agent's
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
                silence.poll(now)
                if stop is None and caught:
                    name = signal.Signals(caught[0]).name
                    stop = JobInterrupted(f"job stopped by {name}; every rank was terminated", log_dir=log_dir)
                elif stop is None and deadline is not None and now > deadline:
                    stop = JobTimeout(f"job timed out after {plan.timeout:g} s (dist.timeout); every rank was "
                                      "terminated", log_dir=log_dir)
                elif stop is None and join_deadline is not None and now > join_deadline:
                    stop = JobTimeout(f"rendezvous at {plan.rdzv_endpoint} did not complete within "
                                      f"{plan.join_timeout:g} s (dist.rdzv_conf.join_timeout); is something else "
                                      "listening there?", log_dir=log_dir)
                if stop is not None and kill_at is None:
                    kill_at = now + AGENT_STOP_GRACE_S
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


def _count_job() -> None:
    global _jobs_supervised
    _jobs_supervised += 1


class SilenceNotice:
    """Says, on stderr, what the ranks are doing while they start and have printed nothing for a while."""

    def __init__(self, log_dir: str, since: float) -> None:
        self.log_dir, self.since = log_dir, since
        self.quiet_since = since  # the last output of a rank, or the last note
        self.size = 0
        self.next_check = since + 1.0
        self.done = False

    def poll(self, now: float) -> None:
        if self.done or now < self.next_check:
            return
        self.next_check = now + 1.0
        size, rank0_printed = rank_output(self.log_dir)
        if rank0_printed or now - self.since > SILENT_WATCH_S:
            self.done = True
        elif size != self.size:
            self.size, self.quiet_since = size, now
        elif now - self.quiet_since >= SILENT_S:
            print(f"dsconf: note: the ranks have printed nothing for {now - self.quiet_since:.0f} s ("
                  f"{now - self.since:.0f} s since the start): they import torch and the script's modules, join the "
                  f"process group and build the DeepSpeed engine (logs: {self.log_dir})", file=sys.stderr, flush=True)
            self.quiet_since = now


def rank_output(log_dir: str) -> tuple[int, bool]:
    """The bytes the ranks' stdout and stderr logs under ``log_dir`` hold (restarted attempts included), and whether
    rank 0's stdout holds any."""
    total, rank0 = 0, False
    for root, _, files in os.walk(log_dir):
        for name in files:
            if name.endswith((".stdout.log", ".stderr.log")):
                with contextlib.suppress(OSError):
                    size = os.path.getsize(os.path.join(root, name))
                    total += size
                    rank0 = rank0 or (name == "rank0.stdout.log" and size > 0)
    return total, rank0


def process_age() -> float:
    """Seconds since this process started (Linux: from /proc), else 0."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = float(fh.read().rsplit(")", 1)[1].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


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
    # torch's log tailer writes the ranks' lines here without flushing: line by line, as on a terminal, also when
    # stdout is a pipe or a file (SLURM's output file, `| tee`), or they would all come out as the job ends
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(line_buffering=True)
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
        outcome = agent_failed(err, plan, log_dir)
    try:
        conn.send_bytes(pickle.dumps(("outcome", outcome)))
    except Exception as err:  # pragma: no cover - results are bytes already
        conn.send_bytes(pickle.dumps(("outcome", JobFailed(f"could not report the job's outcome: {err}"))))
    conn.close()


def _run_elastic(plan: JobPlan, arg: Any, log_dir: str, *, tee: bool,
                 on_start: Optional[Callable[[], None]] = None) -> dict[int, Any]:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    try:
        return elastic_launch(launch_config(plan, log_dir, tee=tee, on_start=on_start), run_rank)(arg)
    except ChildFailedError as err:
        raise job_failed(err, log_dir) from None
    except SignalException as err:
        raise JobInterrupted(f"job stopped by {err.sigval.name}; every rank was terminated",
                             log_dir=log_dir) from None


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
