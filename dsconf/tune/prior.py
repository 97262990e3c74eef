"""The memory prior: which candidates should not fit, before they are run.

A candidate's accelerator memory per rank is predicted as

    measured at the probe (fitted over its micro batches)  - model states of the probe's ZeRO option
                                                           + model states of the candidate's ZeRO option

The probe is the leanest candidate (``space.leanest``: the most offloaded, highest stage) run at the two smallest
micro batches; a straight line through its peaks gives what does not depend on the ZeRO option (activations,
which grow with the micro batch, plus the runtime's own memory). Model states come from DeepSpeed's estimators
(``dsconf.estimate``, as ``dsconf estimate`` prints them) for the model's parameter count and largest layer, which
the probe's ranks report:

- stages 2 and 3: DeepSpeed's rows for the offload (stage 3 with and without ``zero.Init``: the larger);
- stages 0 and 1: DeepSpeed has no estimator; its ZeRO-2 estimate for a single GPU is the unpartitioned figure
  (stage 0's, and an upper bound for stage 1, which partitions the optimizer states only);
- NVMe offload: the CPU-offload rows (the accelerator side is the same).

On a CPU-only host the "accelerator" is the host's RAM: a rank's prediction adds its share of what DeepSpeed
estimates for the CPU (offloading moves memory, it does not save it there).

A candidate whose prediction is over the limit (``hydra.sweeper.memory_limit``, else the accelerator's memory as
the probe reports it; on a CPU-only host the RAM divided by the ranks per node) is pruned, its prediction recorded.
The user's own dimensions (``key=choice(...)``) are not modelled: they share the prediction of their ZeRO option.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from dsconf.tune.settings import OFFLOADS, format_size
from dsconf.tune.space import Candidate


@dataclass
class Probe:
    """What the probe measured (kept in the study's storage, so a resumed study does not probe again)."""

    stage: int
    offload: str
    points: List[Tuple[int, int]]  # (micro batch, peak memory bytes of the hungriest rank)
    params: int
    largest_layer_params: int
    total_memory_bytes: int  # of one accelerator (on a CPU-only host: the host's RAM)
    cpu_only: bool
    nproc_per_node: int
    nodes: int

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Probe:
        data = dict(data)
        data["points"] = [tuple(p) for p in data["points"]]
        return cls(**data)


def fit(points: List[Tuple[int, int]]) -> Tuple[float, float]:
    """(bytes at micro batch 0, bytes per sample) through the probe's points; one point: no slope. A slope below
    zero (noise: two runs within the allocator's rounding) is taken as zero."""
    if len(points) < 2:
        return float(points[0][1]), 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / var) if var else 0.0
    return mean_y - slope * mean_x, slope


class Prior:
    def __init__(self, probe: Probe, memory_limit: Optional[int]) -> None:
        self.probe = probe
        self.intercept, self.per_sample = fit(probe.points)
        self._states: Dict[Tuple[int, str], int] = {}
        self.rows = _estimates(probe)
        self.limit = memory_limit if memory_limit is not None else self.default_limit()
        self.limit_source = "hydra.sweeper.memory_limit" if memory_limit is not None else (
            "the host's RAM / ranks per node" if probe.cpu_only else "the accelerator's memory")

    def default_limit(self) -> int:
        if self.probe.cpu_only:
            return self.probe.total_memory_bytes // max(1, self.probe.nproc_per_node)
        return self.probe.total_memory_bytes

    def model_states(self, stage: int, offload: str) -> int:
        """Bytes of model states on one rank's accelerator (see the module doc)."""
        key = (stage, offload)
        if key not in self._states:
            optimizer_device, param_device = OFFLOADS[offload]
            on_optimizer, on_param = optimizer_device != "none", param_device != "none" and stage == 3
            if stage < 2:
                rows = [r for r in self.rows["single"] if r.stage == 2 and r.offload_optimizer == on_optimizer]
            else:
                rows = [r for r in self.rows["world"] if r.stage == stage and r.offload_optimizer == on_optimizer
                        and r.offload_param == on_param]
            if not rows:  # params offloaded without the optimizer: DeepSpeed has no row; the optimizer-too row's
                rows = [r for r in self.rows["world"] if r.stage == stage and r.offload_param == on_param]
            gpu = max(r.per_gpu_bytes for r in rows)
            cpu = max(r.per_cpu_bytes for r in rows)
            nproc = 1 if stage < 2 else max(1, self.probe.nproc_per_node)
            self._states[key] = int(gpu + (cpu / nproc if self.probe.cpu_only else 0))
        return self._states[key]

    def predict(self, candidate: Candidate) -> int:
        probe_states = self.model_states(self.probe.stage, self.probe.offload)
        base = self.intercept + self.per_sample * candidate.micro_batch
        return int(base - probe_states + self.model_states(candidate.stage, candidate.offload))

    def over(self, candidate: Candidate) -> Optional[str]:
        """Why the candidate is pruned, or None when it is predicted to fit."""
        predicted = self.predict(candidate)
        if predicted <= self.limit:
            return None
        return (f"predicted {format_size(predicted)} per rank > limit {format_size(self.limit)} "
                f"({self.limit_source})")

    def describe(self) -> str:
        points = ", ".join(f"micro batch {m}: {format_size(b)}" for m, b in self.probe.points)
        return (f"probe at stage {self.probe.stage} offload={self.probe.offload} ({points}): "
                f"{format_size(self.per_sample)} per sample; {self.probe.params:,} params, largest layer "
                f"{self.probe.largest_layer_params:,}; limit {format_size(self.limit)} ({self.limit_source})")


def _estimates(probe: Probe) -> Dict[str, list]:
    """DeepSpeed's rows for the job's world, and for a single GPU (stages 0 and 1)."""
    # DeepSpeed's import detects the accelerator: through NVML, so that this process (which forks the trials' jobs)
    # does not initialise CUDA; and whatever it prints goes to stderr, not into the sweep's output
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    from dsconf.estimate import estimate

    largest = max(1, min(probe.largest_layer_params, probe.params))
    with contextlib.redirect_stdout(sys.stderr):
        world = estimate(max(1, probe.params), largest, gpus_per_node=probe.nproc_per_node, nodes=probe.nodes)
        single = estimate(max(1, probe.params), largest, gpus_per_node=1, nodes=1)
    return {"world": world, "single": single}
