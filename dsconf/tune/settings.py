"""The tuner's settings (``hydra.sweeper.*`` of ``hydra/sweeper=dsconf_tune``): their one statement, and their checks.

``TuneConfig`` is the structured config Hydra shows and types (the plugin in ``hydra_plugins/dsconf_tune`` registers
it with its ``_target_``); ``read_settings`` turns what Hydra passes the sweeper into ``TuneSettings``, one
``ConfigError`` naming every bad key (``hydra.sweeper.<key>``) and what would be valid. Standard library only: the
plugin's config module imports this for every Hydra app.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from dsconf.errors import ConfigError, Problem

PREFIX = "hydra.sweeper"
STAGES = (0, 1, 2, 3)
# what each offload choice moves off the accelerator, and where to
OFFLOADS: Dict[str, Tuple[str, str]] = {  # name -> (offload_optimizer.device, offload_param.device)
    "none": ("none", "none"),
    "optimizer": ("cpu", "none"),
    "all": ("cpu", "cpu"),
    "optimizer_nvme": ("nvme", "none"),
    "all_nvme": ("nvme", "nvme"),
}
CPU_OFFLOADS = ("none", "optimizer", "all")
NVME_OFFLOADS = ("optimizer_nvme", "all_nvme")
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)", re.IGNORECASE)
SIZE_FORMS = "bytes (25769803776) or a number and a unit: 24GiB, 512MiB, 80GB"


@dataclass
class TuneSpace:
    # ZeRO stages to try
    stage: List[int] = field(default_factory=lambda: list(STAGES))
    # none | optimizer (optimizer states to CPU) | all (optimizer and params to CPU, stage 3);
    # optimizer_nvme | all_nvme need nvme_path (and are added by default when it is set)
    offload: Optional[List[str]] = None
    # micro batches per GPU (null: every power of two that divides the global batch / world size)
    micro_batch: Optional[List[int]] = None


@dataclass
class TuneConfig:
    # optimizer steps timed per trial, after warmup_steps
    steps: int = 5
    # optimizer steps left out first (op builds, ZeRO-3's trace cache, the allocator's warm-up); at least 1
    warmup_steps: int = 2
    # memory per accelerator a candidate may use: bytes or a string such as 24GiB (null: the accelerator's own,
    # as the first trial reports it; on a CPU-only host the RAM divided by the ranks per node)
    memory_limit: Any = None
    # the best few re-run for top_k_steps before the winner is named (0: none)
    top_k: int = 2
    # their timed steps (null: 3 x steps; as many as the script makes when it stops sooner, at least steps)
    top_k_steps: Optional[int] = None
    # trials measured at most; a space of at most this many candidates is searched in full (a grid)
    n_trials: int = 16
    # Optuna storage URL (null: an SQLite file, tune.db, in the sweep dir); the same command resumes the study
    storage: Optional[str] = None
    study_name: str = "dsconf_tune"
    # a directory on an NVMe drive: adds NVMe offload to the space
    nvme_path: Optional[str] = None
    seed: int = 0
    space: TuneSpace = field(default_factory=TuneSpace)
    # more dimensions, in Hydra's sweep syntax (key: "choice(a,b)" or "a,b"), like the basic sweeper's params
    params: Optional[Dict[str, str]] = None


@dataclass(frozen=True)
class TuneSettings:
    """``TuneConfig`` checked: what the tuner runs on."""

    steps: int
    warmup_steps: int
    memory_limit: Optional[int]
    top_k: int
    top_k_steps: int
    n_trials: int
    storage: Optional[str]
    study_name: str
    nvme_path: Optional[str]
    seed: int
    stages: Tuple[int, ...]
    offloads: Tuple[str, ...]
    micro_batches: Optional[Tuple[int, ...]]
    params: Tuple[Tuple[str, str], ...] = ()


def parse_size(value: Any, path: str = f"{PREFIX}.memory_limit") -> int:
    """Bytes from an int or a string such as ``24GiB``, ``512MiB``, ``80GB``, ``1.5e9``; ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(Problem(path, f"cannot read {value!r} as a size", SIZE_FORMS))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = float(value), ""
    else:
        match = _SIZE.fullmatch(str(value).strip())
        if match is None or match.group(2).lower() not in _UNITS:
            raise ConfigError(Problem(path, f"cannot read {value!r} as a size", SIZE_FORMS))
        number, unit = float(match.group(1)), match.group(2).lower()
    nbytes = number * _UNITS[unit]
    if not math.isfinite(nbytes) or nbytes < 1:
        raise ConfigError(Problem(path, f"must be at least 1 byte, got {value!r}", SIZE_FORMS))
    return int(nbytes)


def format_size(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return ""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def read_settings(cfg: Any) -> TuneSettings:
    """``TuneSettings`` from the sweeper's config (a mapping, or the keyword arguments Hydra instantiates it with)."""
    get = cfg.get
    problems: list[Problem] = []

    def whole(key: str, low: int) -> int:
        value = get(key, getattr(TuneConfig, key, None))
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(Problem(f"{PREFIX}.{key}", f"must be a whole number >= {low}, got {value!r}"))
            return low
        return value

    steps, warmup, top_k, n_trials = whole("steps", 1), whole("warmup_steps", 1), whole("top_k", 0), whole(
        "n_trials", 1)
    seed = whole("seed", 0)
    top_k_steps = 3 * steps if get("top_k_steps") is None else whole("top_k_steps", 1)
    memory_limit = None
    if get("memory_limit") is not None:
        try:
            memory_limit = parse_size(get("memory_limit"))
        except ConfigError as err:
            problems += err.problems
    nvme_path = get("nvme_path") or None
    space = get("space") or {}
    stages = _list(space, "stage", list(STAGES), problems)
    bad = [s for s in stages if isinstance(s, bool) or s not in STAGES]
    if bad or not stages:
        problems.append(Problem(f"{PREFIX}.space.stage", f"ZeRO stages 0 to 3, got {stages!r}",
                                "e.g. hydra.sweeper.space.stage=[0,2,3]"))
    default_offloads = list(CPU_OFFLOADS) + (list(NVME_OFFLOADS) if nvme_path else [])
    offloads = _list(space, "offload", default_offloads, problems)
    valid = list(OFFLOADS) if nvme_path else list(CPU_OFFLOADS)
    unknown = [str(o) for o in offloads if o not in valid]
    if [o for o in unknown if o in NVME_OFFLOADS]:
        problems.append(Problem(f"{PREFIX}.space.offload", f"{', '.join(unknown)} offload to NVMe, but "
                                f"{PREFIX}.nvme_path is not set", "set hydra.sweeper.nvme_path=/path/on/nvme"))
    elif unknown or not offloads:
        problems.append(Problem(f"{PREFIX}.space.offload", f"unknown offload {', '.join(unknown) or '(empty list)'}",
                                f"valid: {', '.join(valid)}"))
    micro = space.get("micro_batch")
    micro_batches = None
    if micro is not None:
        micro_batches = _list(space, "micro_batch", [], problems)
        if not micro_batches or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in micro_batches):
            problems.append(Problem(f"{PREFIX}.space.micro_batch", f"whole numbers >= 1, got {micro!r}",
                                    "e.g. hydra.sweeper.space.micro_batch=[1,2,4], or null for every power of two "
                                    "the global batch allows"))
    params = get("params") or {}
    if problems:
        raise ConfigError(problems)
    return TuneSettings(
        steps=steps, warmup_steps=warmup, memory_limit=memory_limit, top_k=top_k, top_k_steps=top_k_steps,
        n_trials=n_trials, storage=get("storage") or None, study_name=str(get("study_name") or TuneConfig.study_name),
        nvme_path=nvme_path, seed=seed, stages=tuple(dict.fromkeys(stages)), offloads=tuple(dict.fromkeys(offloads)),
        micro_batches=tuple(dict.fromkeys(micro_batches)) if micro_batches else None,
        params=tuple((str(k), str(v)) for k, v in params.items()))


def _list(space: Any, key: str, default: list, problems: list[Problem]) -> list:
    value = space.get(key)
    if value is None:
        return list(default)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        problems.append(Problem(f"{PREFIX}.space.{key}", f"must be a list, got {value!r}",
                                f"e.g. hydra.sweeper.space.{key}=[{', '.join(map(str, default[:2])) or '1,2'}]"))
        return list(default)
    return list(value)
