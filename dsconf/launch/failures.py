"""How a distributed job ends when it does not complete: ``JobFailed`` and its subclasses, with one-line headlines.

Every end of a job that is not rank 0's return value is a ``JobFailed``: a failed rank (its error text, the root
cause first), a timeout (``JobTimeout``), an interrupt (``JobInterrupted``), or an error of the elastic agent itself
(rendezvous, store, network). The messages are built here, from what torch elastic leaves behind, so the launcher,
the sweep and ``@dsconf.main`` all report a job's end the same way. No torch import: torch's error objects are read
by their attributes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from dsconf.launch.plan import JobPlan


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


def job_failed(err: Any, log_dir: str) -> JobFailed:
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


def agent_failed(err: BaseException, plan: JobPlan, log_dir: str) -> JobFailed:
    """An error of the agent itself (rendezvous, store, network) as a one-line ``JobFailed``."""
    text = " ".join(str(err).split()) or type(err).__name__
    module = type(err).__module__ or ""
    if "rendezvous" in module or "Dist" in type(err).__name__ or isinstance(err, (OSError, TimeoutError)):
        where = f"rendezvous at {plan.rdzv_endpoint} ({plan.rdzv_backend}, id {plan.rdzv_id}) failed"
        return JobFailed(f"{where}: {type(err).__name__}: {_short(text)}", log_dir=log_dir)
    return JobFailed(f"the elastic agent failed: {type(err).__name__}: {_short(text)}", log_dir=log_dir)


def _message(message: Any) -> tuple[str, str]:
    """(text, traceback) of an error-file message as torch's ``record`` writes it."""
    if isinstance(message, dict):
        return str(message.get("message", "")), str(message.get("extraInfo", {}).get("py_callstack", ""))
    return str(message), ""


def _short(text: str, width: int = 240) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
