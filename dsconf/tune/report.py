"""The tuner's ``report.html``: every candidate in a table, throughput against peak memory, step time per stage.

- *Throughput vs peak memory*: one point per measured candidate (colour: ZeRO stage, marker: offload), the Pareto
  front (no other candidate is both faster and leaner) drawn through them, the winner starred; infeasible
  candidates (out of memory) and pruned ones (predicted over the limit, or needing more than one that ran out) at
  zero throughput, at their predicted memory; the memory limit as a dashed line.
- *Step time per stage*: the measured candidates' step times, grouped by offload and micro batch
  (``dsconf.launch.plots.grouped``, as ``dsconf report`` draws a sweep's metrics).

Written at the end of a study, and by ``dsconf report SWEEP_DIR`` from the sweep dir's ``trials.json`` and
``summary.md``.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import List, Sequence, Union

from dsconf.tune.results import SUMMARY_FILE, Record, ranked, read_trials
from dsconf.tune.settings import format_size

REPORT_FILE = "report.html"
STAGE_COLORS = {0: "#1f77b4", 1: "#2ca02c", 2: "#ff7f0e", 3: "#9467bd"}
OFFLOAD_MARKERS = {"none": "o", "optimizer": "s", "all": "D", "optimizer_nvme": "v", "all_nvme": "^"}
GIB = 2**30


def write_tune_report(sweep_dir: Union[str, Path]) -> Path:
    from dsconf.launch.plots import Plotter, figure_html, html_page, table_html

    sweep_dir = Path(sweep_dir)
    records = ranked(read_trials(sweep_dir))
    plot = Plotter()
    figures = [figure_html("throughput vs peak memory", _scatter(plot, records),
                           "Measured candidates by peak memory per rank (the hungriest rank); the line is the Pareto "
                           "front. Infeasible and pruned candidates sit at zero throughput, at their predicted "
                           "memory.")]
    measured = [r for r in records if r.status == "ok" and r.step_time_s]
    if measured:
        values = [(f"stage {r.stage}", f"{r.offload}, micro {r.micro_batch}", float(r.step_time_s or 0))
                  for r in sorted(measured, key=lambda r: (r.stage, r.offload, r.micro_batch))]
        figures.append(figure_html("step time per stage", plot.grouped(
            "step time per stage", "seconds per optimizer step (slowest rank)", "ZeRO stage", values,
            group_title="offload, micro batch"),
            "Seconds per optimizer step, the global batch the same in every trial."))
    esc = html.escape
    winner = next((r for r in records if r.winner), None)
    body = ["<h1>dsconf tune report</h1>", f"<p><code>{esc(str(sweep_dir.resolve()))}</code></p>"]
    facts = _facts(sweep_dir)
    if facts:
        body += ["<ul>", *(f"<li>{esc(fact)}</li>" for fact in facts), "</ul>"]
    if winner is not None:
        body.append(f"<p><b>Best:</b> <code>{esc(winner.candidate)}</code>, {winner.throughput or 0:.1f} samples/s "
                    f"(best.yaml)</p>")
    body += ['<div class="plots">', *figures, "</div>", "<h2>Candidates</h2>", *table_html(_rows(records), 2)]
    path = sweep_dir / REPORT_FILE
    path.write_text(html_page(f"dsconf tune report: {sweep_dir.name}", body), encoding="utf-8")
    return path


def _scatter(plot, records: Sequence[Record]) -> str:
    from dsconf.launch.plots import PointSet, pareto_front

    sets: List[PointSet] = []
    ok = [r for r in records if r.status == "ok" and r.peak_memory_bytes and r.throughput]
    for stage in sorted({r.stage for r in ok}):
        for offload in [o for o in OFFLOAD_MARKERS if any(r.stage == stage and r.offload == o for r in ok)]:
            chosen = [r for r in ok if r.stage == stage and r.offload == offload]
            sets.append(PointSet(f"stage {stage}, offload {offload}",
                                 [(float(r.peak_memory_bytes or 0), float(r.throughput or 0)) for r in chosen],
                                 marker=OFFLOAD_MARKERS[offload], color=STAGE_COLORS.get(stage),
                                 notes=[f"mb {r.micro_batch}" for r in chosen]))
    winner = [r for r in ok if r.winner]
    if winner:
        sets.append(PointSet("best", [(float(winner[0].peak_memory_bytes or 0), float(winner[0].throughput or 0))],
                             marker="*", color="gold"))
    for status, marker, color in (("infeasible", "x", "red"), ("pruned", "o", "grey")):
        # what a run that ran out of memory had reached says little: both at the prior's prediction when it made one
        chosen = [r for r in records if r.status == status and (r.predicted_memory_bytes or r.peak_memory_bytes)]
        sets.append(PointSet(f"{status} ({len(chosen)})",
                             [(float(r.predicted_memory_bytes or r.peak_memory_bytes or 0), 0.0) for r in chosen],
                             marker=marker, color=color, hollow=status == "pruned"))
    front = pareto_front([(float(r.peak_memory_bytes or 0), float(r.throughput or 0)) for r in ok])
    limit = _limit(records)
    memory = [x for s in sets for x, _ in s.points]
    # a limit far beyond every candidate would squeeze them into a corner: then it is named, not drawn
    drawn = bool(limit) and (not memory or limit <= 1.5 * max(memory))
    span = memory + ([limit] if drawn else [])
    scale = GIB if span and max(span) >= GIB else 2**20
    unit = "GiB" if scale == GIB else "MiB"
    title = "throughput vs peak memory" + ("" if drawn or not limit else f" (limit {format_size(limit)}, off the axis)")
    return plot.scatter(title, f"peak memory per rank ({unit})", "samples/s", sets, front=front,
                        front_label="Pareto front", xscale=scale,
                        vlines=[(limit, f"limit {format_size(limit)}")] if drawn else [])


def _limit(records: Sequence[Record]) -> float:
    return float(next((r.memory_limit_bytes for r in records if r.memory_limit_bytes), 0))


def _rows(records: Sequence[Record]) -> List[List[str]]:
    rows = [["#", "candidate", "status", "micro x accum", "step (s)", "samples/s", "peak memory", "predicted",
             "job", "reason / error"]]
    for i, r in enumerate(records, 1):
        step = r.confirmed.get("step_time_s") if r.confirmed else r.step_time_s
        rows.append([f"{i}{' (best)' if r.winner else ''}", r.candidate, r.status,
                     f"{r.micro_batch} x {r.gradient_accumulation_steps}", "" if step is None else f"{step:.4g}",
                     "" if r.throughput is None else f"{r.throughput:.1f}", format_size(r.peak_memory_bytes),
                     format_size(r.predicted_memory_bytes), "" if r.job is None else str(r.job), r.reason])
    return rows


def _facts(sweep_dir: Path) -> List[str]:
    """The study's facts: the bullet lines at the head of its summary.md."""
    try:
        lines = (sweep_dir / SUMMARY_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [line[2:].replace("`", "") for line in lines if line.startswith("- ")]
