"""What a study leaves in the sweep dir: ``trials.json``, ``summary.md``, ``best.yaml`` (``report.html``: ``report``).

- ``trials.json``: one object per candidate (measured, infeasible, pruned by the prior or by a measured
  out-of-memory, failed, or not reached by the search), best first; rewritten after every trial, so a study stopped
  midway leaves what it had;
- ``summary.md``: the same as a table, under a header with the study's facts and the winner;
- ``best.yaml``: the winner as a Hydra primary config: dsconf's base config with the trial's group choices, then
  the trial's whole config, interpolations kept (``${hydra:runtime.output_dir}`` is the new run's): ``python
  train.py --config-dir SWEEP_DIR --config-name best`` trains it, ``dsconf show --config-dir SWEEP_DIR
  --config-name best`` composes it.

Standard library (and OmegaConf for ``best.yaml``) only: ``dsconf report`` reads ``trials.json`` back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from dsconf.launch.report import strict_json
from dsconf.tune.settings import format_size

TRIALS_FILE = "trials.json"
SUMMARY_FILE = "summary.md"
BEST_FILE = "best.yaml"
STATUS_ORDER = {"ok": 0, "infeasible": 1, "failed": 2, "pruned": 3}


@dataclass
class Record:
    """One candidate, as trials.json holds it."""

    candidate: str
    overrides: List[str]
    stage: int
    offload: str
    micro_batch: int
    gradient_accumulation_steps: int
    train_batch_size: int
    world_size: int
    status: str = "pruned"  # ok | infeasible | pruned | failed
    reason: str = ""  # why infeasible, pruned or failed (one line)
    extras: Dict[str, str] = field(default_factory=dict)  # the user's dimensions: key -> override
    predicted_memory_bytes: Optional[int] = None
    memory_limit_bytes: Optional[int] = None  # what the prediction was held against
    peak_memory_bytes: Optional[int] = None
    rank_peak_memory_bytes: List[Optional[int]] = field(default_factory=list)
    memory_measure: str = ""
    step_time_s: Optional[float] = None
    rank_step_time_s: List[Optional[float]] = field(default_factory=list)
    slowest_rank: Optional[int] = None
    samples_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    probe: bool = False  # run by the memory probe
    confirmed: Optional[Dict[str, Any]] = None  # top_k's longer re-run: step_time_s, samples_per_s, steps, job
    job: Optional[int] = None
    job_dir: str = ""
    log_dir: str = ""
    wall_s: Optional[float] = None
    winner: bool = False
    environment: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Record:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def throughput(self) -> Optional[float]:
        """Samples/s, from the longer re-run when there was one."""
        if self.confirmed and self.confirmed.get("samples_per_s"):
            return float(self.confirmed["samples_per_s"])
        return self.samples_per_s


def ranked(records: Sequence[Record]) -> List[Record]:
    """Winner first, then the measured by throughput, then infeasible, failed, pruned."""
    return sorted(records, key=lambda r: (not r.winner, STATUS_ORDER.get(r.status, 9), -(r.throughput or 0.0),
                                          r.stage, r.micro_batch))


def write_trials(records: Sequence[Record], sweep_dir: Path) -> Path:
    path = sweep_dir / TRIALS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps([strict_json(r.as_dict()) for r in ranked(records)], indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_trials(sweep_dir: Path) -> List[Record]:
    data = json.loads((Path(sweep_dir) / TRIALS_FILE).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError("not a list of candidates")
    return [Record.from_dict(item) for item in data]


def _num(value: Optional[float], digits: str = ".4g") -> str:
    return "" if value is None else format(value, digits)


def summary_table(records: Sequence[Record]) -> List[str]:
    header = ["#", "candidate", "status", "micro x accum", "step (s)", "samples/s", "tokens/s", "peak memory",
              "predicted", "job", "reason / error"]
    rows = [header, ["---"] * len(header)]
    for i, r in enumerate(ranked(records), 1):
        step = r.confirmed.get("step_time_s") if r.confirmed else r.step_time_s
        rows.append([f"{i}{' (best)' if r.winner else ''}", r.candidate, r.status,
                     f"{r.micro_batch} x {r.gradient_accumulation_steps}", _num(step), _num(r.throughput, ".1f"),
                     _num(r.tokens_per_s if not r.confirmed else r.confirmed.get("tokens_per_s"), ".0f"),
                     format_size(r.peak_memory_bytes), format_size(r.predicted_memory_bytes),
                     "" if r.job is None else str(r.job), r.reason])
    return ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]


def write_summary(records: Sequence[Record], sweep_dir: Path, facts: Sequence[str]) -> Path:
    counts = {s: sum(r.status == s for r in records) for s in STATUS_ORDER}
    winner = next((r for r in records if r.winner), None)
    lines = ["# dsconf tune summary", "", *[f"- {fact}" for fact in facts],
             f"- {len(records)} candidates: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    if winner is not None:
        lines.append(f"- best: `{winner.candidate}`, {_num(winner.throughput, '.1f')} samples/s, peak "
                     f"{format_size(winner.peak_memory_bytes)} (best.yaml)")
    lines += ["", *summary_table(records), ""]
    path = sweep_dir / SUMMARY_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_best(sweep_config: Any, winner: Record, sweep_dir: Path, group_names: Sequence[str]) -> Path:
    """``best.yaml``: dsconf's base config with the winning trial's group choices, then its whole config."""
    from omegaconf import OmegaConf

    from dsconf.launch.hydra_support import task_cfg
    from dsconf.names import BASE_CONFIG_NAME

    choices = dict(OmegaConf.select(sweep_config, "hydra.runtime.choices") or {})
    defaults: List[Any] = [BASE_CONFIG_NAME]
    defaults += [{f"override {group}": choices[group]} for group in group_names
                 if choices.get(group) not in (None, "null")]
    # interpolations kept: ${hydra:runtime.output_dir} and ${now:...} are the new run's, not the trial's
    body = OmegaConf.to_container(task_cfg(sweep_config), resolve=False, enum_to_str=True)
    assert isinstance(body, dict)
    text = OmegaConf.to_yaml(OmegaConf.create({"defaults": [*defaults, "_self_"], **body}))
    speed = f"{winner.throughput:.1f} samples/s" if winner.throughput else "measured"
    head = [f"# The fastest configuration the tuner measured: {winner.candidate}",
            f"# {speed}, step {_num(winner.step_time_s)} s, peak memory {format_size(winner.peak_memory_bytes)} "
            f"per rank ({winner.memory_measure}); trial job {winner.job}",
            "# Train with it:   python <your script> --config-dir <this dir> --config-name best",
            "# Its DeepSpeed dict: dsconf show --config-dir <this dir> --config-name best"]
    path = sweep_dir / BEST_FILE
    path.write_text("\n".join(head) + "\n" + text, encoding="utf-8")
    return path
