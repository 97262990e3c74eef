"""One trial: a candidate's job through the app's own launcher, measured on every rank, and what became of it.

The job is an ordinary job of the sweep (``launcher.launch([overrides], job_num)``: fresh rank processes, since a
DeepSpeed engine cannot be re-initialised in place), with ``DSCONF_TUNE_TRIAL`` in its environment so that each rank
measures itself (``dsconf.launch.trial_meter``) and leaves ``<job dir>/trial/rank{N}.json``. From those:

- ``ok``: every rank made ``warmup_steps + steps`` optimizer steps. The step time is the **slowest rank's** mean
  over the timed steps (every rank times its whole step, data loading included); samples/s is the global batch
  over it, tokens/s that times the sequence length when the task reported one; the peak memory is the hungriest
  rank's;
- ``infeasible``: a rank ran out of memory (``torch.OutOfMemoryError``, the accelerator's OOM, ``MemoryError``), or
  was killed by SIGKILL, as the kernel's out-of-memory killer does;
- ``failed``: anything else (a config mistake, a bug, a hang ended at ``dist.timeout``, a function that made fewer
  optimizer steps than the trial needs). The tuner stops the study on it: a bug must never read as "does not fit".
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from dsconf.launch.trial_meter import TRIAL_DIR, TRIAL_ENV

OK, INFEASIBLE, PRUNED, FAILED = "ok", "infeasible", "pruned", "failed"
MTIME_SLACK_S = 2.0


@dataclass
class Outcome:
    status: str
    job: int
    job_dir: str = ""
    log_dir: str = ""
    wall_s: float = 0.0
    error: str = ""  # one line
    config_error: bool = False
    step_time_s: Optional[float] = None
    rank_step_time_s: List[Optional[float]] = field(default_factory=list)
    slowest_rank: Optional[int] = None
    samples_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    rank_peak_memory_bytes: List[Optional[int]] = field(default_factory=list)
    memory_measure: str = ""
    ranks: List[Dict[str, Any]] = field(default_factory=list)  # the rank files, as written

    def facts(self, key: str) -> Any:
        """A fact every rank reports the same (the model's size, the batch): rank 0's."""
        return self.ranks[0].get(key) if self.ranks else None


def run_trial(launcher: Any, overrides: Sequence[str], job: int, *, steps: int, warmup_steps: int,
              sweep_dir: Path, min_steps: Optional[int] = None) -> Outcome:
    """Run the candidate's job and read what its ranks measured. ``min_steps`` (default: ``steps``): the timed steps
    a rank must have made for the trial to count, should the training function end before ``steps``."""
    os.environ[TRIAL_ENV] = json.dumps({"steps": steps, "warmup_steps": warmup_steps})
    started, wall = time.time(), time.monotonic()
    try:
        ret = launcher.launch([list(overrides)], initial_job_idx=job)[0]
    finally:
        os.environ.pop(TRIAL_ENV, None)
    needed = min_steps if min_steps is not None else steps
    return judge(ret, job, sweep_dir, started, round(time.monotonic() - wall, 3), warmup_steps + needed)


def judge(ret: Any, job: int, sweep_dir: Path, started: float, wall_s: float, needed: int) -> Outcome:
    from hydra.core.utils import JobStatus

    error = ret._return_value if ret.status != JobStatus.COMPLETED else None
    job_dir = _job_dir(ret, error, sweep_dir, job)
    log_dir = getattr(error, "log_dir", None) or str(Path(job_dir) / "logs")
    ranks = read_ranks(Path(job_dir), since=started)
    outcome = Outcome(FAILED, job, job_dir=job_dir, log_dir=log_dir, wall_s=wall_s, ranks=ranks)
    if error is not None:
        oom = [r for r in ranks if (r.get("error") or {}).get("out_of_memory")]
        if oom:
            outcome.status = INFEASIBLE
            outcome.error = f"rank {oom[0]['rank']}: {oom[0]['error']['message']}"
        elif _killed(error):
            outcome.status = INFEASIBLE
            outcome.error = (f"{_headline(error)} (SIGKILL: what the kernel's out-of-memory killer sends)")
        else:
            from dsconf.errors import ConfigError

            outcome.error = _headline(error)
            outcome.config_error = isinstance(error, ConfigError)
        _memory(outcome)
        return outcome
    world = int(ranks[0].get("world_size", len(ranks))) if ranks else 0
    missing = sorted(set(range(world)) - {int(r["rank"]) for r in ranks}) if ranks else []
    if not ranks or missing:
        outcome.error = (f"rank(s) {', '.join(map(str, missing))} left no measurement" if ranks else
                         "no rank left a measurement: does the task train through DeepSpeed's engine "
                         "(deepspeed.initialize, engine.step)?")
        return outcome
    short = [r for r in ranks if int(r.get("optimizer_steps", 0)) < needed]
    if short:
        r = short[0]
        outcome.error = (f"the training function returned after {r['optimizer_steps']} optimizer step(s); a trial "
                         f"needs warmup_steps + steps = {needed}: let it train longer (e.g. train.steps) "
                         "or lower hydra.sweeper.steps")
        return outcome
    outcome.status = OK
    outcome.rank_step_time_s = [r.get("step_time_s") for r in ranks]
    timed = [(t, int(r["rank"])) for r, t in zip(ranks, outcome.rank_step_time_s) if t is not None]
    outcome.step_time_s, outcome.slowest_rank = max(timed)
    batch = outcome.facts("train_batch_size")
    outcome.samples_per_s = batch / outcome.step_time_s if batch and outcome.step_time_s > 0 else None
    seq = outcome.facts("sequence_length")
    if seq and outcome.samples_per_s:
        outcome.tokens_per_s = outcome.samples_per_s * seq
    _memory(outcome)
    return outcome


def read_ranks(job_dir: Path, since: Optional[float] = None) -> List[Dict[str, Any]]:
    """The ranks' measurement files, by rank; files older than ``since`` (an earlier run's) are left out."""
    out = []
    for path in sorted((job_dir / TRIAL_DIR).glob("rank*.json")):
        try:
            if since is not None and path.stat().st_mtime < since - MTIME_SLACK_S:
                continue
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: int(r.get("rank", 0)))


def _memory(outcome: Outcome) -> None:
    peaks = [r.get("peak_memory_bytes") for r in outcome.ranks]
    outcome.rank_peak_memory_bytes = peaks
    known = [p for p in peaks if p is not None]
    outcome.peak_memory_bytes = max(known) if known else None
    outcome.memory_measure = outcome.facts("memory_measure") or ""


def _job_dir(ret: Any, error: Any, sweep_dir: Path, job: int) -> str:
    try:
        found = str(ret.hydra_cfg.hydra.runtime.output_dir or "")
    except Exception:
        found = ""
    if found:
        return found
    log_dir = getattr(error, "log_dir", None)
    return str(Path(log_dir).parent) if log_dir else str(sweep_dir / str(job))


def _killed(error: Any) -> bool:
    failures = getattr(error, "failures", None) or {}
    return any("SIGKILL" in str(text) for text in failures.values())


def _headline(error: Any) -> str:
    """The error's first line (a failed rank's exception, with its type), without the rank-log trailer."""
    text = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
    first = str(text).strip().splitlines()[0] if str(text).strip() else type(error).__name__
    return " ".join(first.split())
