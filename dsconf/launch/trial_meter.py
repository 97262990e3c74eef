"""What every rank of a tuning trial measures, and how the trial stops the user's training function.

The tuner (``hydra/sweeper=dsconf_tune``, ``dsconf.tune``) runs each trial as an ordinary dsconf job with
``DSCONF_TUNE_TRIAL`` in its environment (JSON: ``steps``, ``warmup_steps``). A rank that finds it runs the user's
function unmodified, with ``DeepSpeedEngine.step`` wrapped so that every rank:

- takes a timestamp at each optimizer step (the accumulation boundary: ``global_steps`` moved), after the
  accelerator has finished its queued work (``synchronize``), so one interval is the whole step as that rank lived
  it: data loading, every micro-batch's forward and backward, the collectives, the optimizer;
- excludes the first ``warmup_steps`` intervals (op builds, allocator warm-up, ZeRO-3's trace cache);
- after ``warmup_steps + steps`` optimizer steps raises ``TrialComplete`` (a ``BaseException``, so a training loop's
  ``except Exception`` does not swallow it) out of ``step``, which ends the user's function there; the rank then
  returns its measurement as the job's result;
- writes ``<job dir>/trial/rank{N}.json``: its step intervals, its peak memory (the accelerator's
  ``max_memory_reserved`` / ``max_memory_allocated``; on a CPU-only host the process's peak RSS), the engine's batch
  triple, the model's parameter count and largest layer (for the tuner's memory prior), the environment, and, if
  the function raised, the error and whether it was an out-of-memory error.

Why not DeepSpeed's own engine-side measurement (its ``autotuning`` section): it sums rank 0's forward, backward and
step timers (data loading left out, other ranks never asked) and ends the process with ``exit()`` at
``end_profile_step``. The tuner takes the slowest rank's whole step instead (``dsconf.tune.trial``).

Without ``DSCONF_TUNE_TRIAL`` nothing here runs. This module imports only the standard library; DeepSpeed and torch
are imported when a trial starts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import resource
import sys
import time
from typing import Any, Callable, Optional

TRIAL_ENV = "DSCONF_TUNE_TRIAL"
TRIAL_DIR = "trial"  # under the job dir: rank{N}.json


class TrialComplete(BaseException):
    """Raised out of ``DeepSpeedEngine.step`` once the trial has its steps: the user's function ends there."""


def requested() -> Optional[dict[str, int]]:
    """The trial's settings from the environment, or None outside a tuning trial."""
    text = os.environ.get(TRIAL_ENV)
    if not text:
        return None
    settings = json.loads(text)
    return {"steps": int(settings["steps"]), "warmup_steps": int(settings["warmup_steps"])}


def run(task_fn: Callable[[Any], Any], cfg: Any, job_dir: Optional[str]) -> Any:
    """``task_fn(cfg)``; inside a tuning trial, measured and stopped after its steps (see the module doc)."""
    settings = requested()
    if settings is None:
        return task_fn(cfg)
    meter = Meter(settings["steps"], settings["warmup_steps"], job_dir or os.getcwd())
    restore = meter.install()
    try:
        task_fn(cfg)
    except TrialComplete:
        pass
    except BaseException as err:
        meter.write(error=err)
        raise
    finally:
        restore()
    return meter.write()


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is an out-of-memory error of the host or accelerator."""
    seen = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return True
        torch = sys.modules.get("torch")
        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)) if t)
        if oom_types and isinstance(current, oom_types):
            return True
        if isinstance(current, OSError) and current.errno == errno.ENOMEM:
            return True
        # what torch reports as RuntimeError: an accelerator's "CUDA error: out of memory" or "HIP out of memory",
        # the CPU allocator's "DefaultCPUAllocator: can't allocate memory"
        text = str(current).lower()
        if isinstance(current, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text):
            return True
        current = current.__cause__ or current.__context__
    return False


class Meter:
    """One rank's measurement of a trial."""

    def __init__(self, steps: int, warmup_steps: int, job_dir: str) -> None:
        self.steps, self.warmup_steps, self.job_dir = steps, warmup_steps, job_dir
        self.rank = int(os.environ.get("RANK", "0"))
        self.boundaries: list[float] = []  # perf_counter() after each optimizer step
        self.engine_facts: dict[str, Any] = {}
        self.memory: dict[str, Any] = {}
        self._accelerator: Any = None

    # ------------------------------------------------------------------------------------- in the rank
    def install(self) -> Callable[[], None]:
        """Wrap ``DeepSpeedEngine.step`` (every engine, HF Trainer's and Accelerate's included); returns the undo."""
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.engine import DeepSpeedEngine

        self._accelerator = get_accelerator()
        original = DeepSpeedEngine.step
        meter = self

        def step(engine: Any, *args: Any, **kwargs: Any) -> Any:
            before = engine.global_steps
            result = original(engine, *args, **kwargs)
            if engine.global_steps != before:  # an optimizer step (an fp16 overflow's skipped step counts too)
                meter.on_optimizer_step(engine)
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        step.__doc__ = original.__doc__
        DeepSpeedEngine.step = step

        def restore() -> None:
            DeepSpeedEngine.step = original

        return restore

    def on_optimizer_step(self, engine: Any) -> None:
        self._accelerator.synchronize()
        self.boundaries.append(time.perf_counter())
        if len(self.boundaries) == 1:
            self.engine_facts = engine_facts(engine)
        if len(self.boundaries) >= self.warmup_steps + self.steps:
            self.memory = self.peak_memory()
            raise TrialComplete()

    def peak_memory(self) -> dict[str, Any]:
        """Peak memory of this rank: the accelerator's counters, or the process's peak RSS on a CPU-only host."""
        acc = self._accelerator
        if acc is not None and acc.device_name() != "cpu":
            reserved, allocated = int(acc.max_memory_reserved()), int(acc.max_memory_allocated())
            return {"peak_memory_bytes": reserved, "max_memory_allocated_bytes": allocated,
                    "memory_measure": f"{acc.device_name()} max_memory_reserved",
                    "total_memory_bytes": int(acc.total_memory())}
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        return {"peak_memory_bytes": int(rss), "max_memory_allocated_bytes": None, "memory_measure": "peak RSS",
                "total_memory_bytes": int(total)}

    # --------------------------------------------------------------------------------------- the record
    def record(self, error: Optional[BaseException] = None) -> dict[str, Any]:
        intervals = [b - a for a, b in zip(self.boundaries, self.boundaries[1:])]
        timed = intervals[self.warmup_steps - 1:] if self.warmup_steps >= 1 else intervals
        needed = self.warmup_steps + self.steps
        record: dict[str, Any] = {
            "rank": self.rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "optimizer_steps": len(self.boundaries),
            "steps_needed": needed,
            "completed": len(self.boundaries) >= needed,
            "step_times_s": [round(t, 6) for t in intervals],
            "timed_steps": len(timed),
            "step_time_s": (sum(timed) / len(timed)) if timed else None,
            **(self.memory or (self.peak_memory() if self._accelerator is not None else {})),
            **self.engine_facts,
            "environment": environment(self._accelerator),
        }
        from dsconf.launch import context

        if context.sequence_length() is not None:
            record["sequence_length"] = context.sequence_length()
        if error is not None:
            text = " ".join(f"{type(error).__name__}: {error}".split())
            record["error"] = {"type": type(error).__name__, "message": text[:2000],
                               "out_of_memory": out_of_memory(error)}
        return record

    def write(self, error: Optional[BaseException] = None) -> dict[str, Any]:
        record = self.record(error)
        folder = os.path.join(self.job_dir, TRIAL_DIR)
        with contextlib.suppress(OSError):
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"rank{self.rank}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=1)
            os.replace(path + ".tmp", path)
        return record


def engine_facts(engine: Any) -> dict[str, Any]:
    """The engine's batch triple and ZeRO stage, and the model's size as the memory prior needs it."""
    def count(params: Any) -> int:  # ZeRO-3 partitions parameters: ds_numel is the full size
        return sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in params)

    module = engine.module
    largest = max((count(m.parameters(recurse=False)) for m in module.modules()), default=0)
    return {
        "train_batch_size": int(engine.train_batch_size()),
        "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
        "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
        "zero_stage": int(engine.zero_optimization_stage()),
        "params": count(module.parameters()),
        "largest_layer_params": largest,
    }


def environment(accelerator: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    for name in ("torch", "deepspeed"):
        module = sys.modules.get(name)
        facts[name] = getattr(module, "__version__", None) if module else None
    if accelerator is not None:
        facts["accelerator"] = accelerator.device_name()
        with contextlib.suppress(Exception):
            if accelerator.device_name() == "cuda":
                import torch

                facts["device"] = torch.cuda.get_device_name()
    return facts
