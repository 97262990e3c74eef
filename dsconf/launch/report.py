"""A sweep's results: the summary the launcher writes after each batch, and ``dsconf report``'s HTML page.

This module is apart from ``sweep.py`` so that ``dsconf report`` reads a finished sweep without importing the
runner (and, through it, torch elastic); it imports the standard library only, and matplotlib only inside
``write_report``, once there is something to plot.

Metrics: the numbers a job leaves behind become one column each in ``summary.md`` / ``summary.json``:

- rank 0's return value: a number is the column ``return``; a dict gives one column per numeric entry
  (nested dicts flattened as ``outer.inner``);
- ``metrics.json`` in the job's output dir (what ``examples/train.py`` writes): one column per numeric entry.

When both name the same metric, the return value wins: it is certainly this run's, whereas ``metrics.json``
may be a file written by an earlier sweep into the same dir (a file older than the job's start is ignored
for that reason, but a job can also rewrite only part of it). Only numbers become columns; booleans are
flags, not measurements, and lists (per-step losses) are curves, drawn by ``dsconf report`` instead.

``dsconf report`` plots only what varies: each metric whose values differ between jobs, against the swept
parameters (the override keys whose values differ: the first along the axis, the others as groups of bars), beside
the curves; the metrics every job shares are listed, not drawn. The drawing is ``dsconf.launch.plots``, which the
tuner's report uses too.
"""

from __future__ import annotations

import html
import json
import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from dsconf.launch.plots import MissingExtraError  # noqa: F401  (dsconf report's error for a missing extra)

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
RETURN_METRIC = "return"  # the column of a return value that is a plain number
REPORT_FILE = "report.html"
# A metrics.json whose mtime is this much before the job started is taken as left over from an earlier run
# in the same dir; the slack covers file systems that store mtimes at a coarse granularity.
MTIME_SLACK_S = 2.0

Number = Union[int, float]
Curve = List[Tuple[float, float]]


@dataclass
class JobRecord:
    """One line of the sweep summary."""

    job: int
    overrides: list[str]
    status: str = "PENDING"  # COMPLETED | FAILED | SKIPPED (UNKNOWN: rebuilt from job dirs without a summary)
    wall_s: float = 0.0
    result: str = ""  # repr of rank 0's return value, or the error's first line
    error: str = ""  # the full error text
    job_dir: str = ""
    metrics: dict[str, Number] = field(default_factory=dict)  # one summary column each


class SweepDirError(ValueError):
    """``dsconf report`` was given something that is not a readable sweep dir."""


# -------------------------------------------------------------------------------------------- metrics
def as_number(value: Any) -> Optional[Number]:
    """``value`` as a plain int or float when it is a numeric scalar (numpy and 0-d torch values included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    # numpy 0-d arrays and torch 0-d tensors: what a training function returns when it forgets .item()
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        try:
            scalar = item()
        except Exception:
            return None
        return None if scalar is value else as_number(scalar)
    return None


def scalar_metrics(data: Mapping[str, Any], prefix: str = "") -> dict[str, Number]:
    """The numeric entries of ``data``, nested mappings flattened with dots; everything else is left out."""
    out: dict[str, Number] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalar_metrics(value, prefix=f"{name}."))
        elif (number := as_number(value)) is not None:
            out[name] = number
    return out


def curves_of(data: Mapping[str, Any]) -> dict[str, Curve]:
    """List entries of a ``metrics.json`` that are curves: numbers (x = 1, 2, ...) or ``[x, y]`` pairs."""
    out: dict[str, Curve] = {}
    for key, value in data.items():
        if not isinstance(value, list) or not value:
            continue
        points: Curve = []
        for i, entry in enumerate(value):
            if (y := as_number(entry)) is not None:
                points.append((float(i + 1), float(y)))
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                x, y = as_number(entry[0]), as_number(entry[1])
                if x is None or y is None:
                    break
                points.append((float(x), float(y)))
            else:
                break
        else:
            out[str(key)] = points
    return out


def read_metrics_file(job_dir: Optional[Path], since: Optional[float] = None) -> dict[str, Any]:
    """The job's ``metrics.json`` as a dict; empty when absent, unreadable, or older than ``since`` (epoch s)."""
    if not job_dir:
        return {}
    path = Path(job_dir) / METRICS_FILE
    try:
        if since is not None and path.stat().st_mtime < since - MTIME_SLACK_S:
            log.warning(f"{path} predates the job: left out of the summary (an earlier run wrote it)")
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # a job killed while writing it leaves half a file
        log.warning(f"{path} is not readable JSON, its metrics are left out: {err}")
        return {}
    return data if isinstance(data, dict) else {}


def job_metrics(return_value: Any, job_dir: Optional[Path], since: Optional[float] = None) -> dict[str, Number]:
    """The summary columns of one job: its return value's numbers first, then ``metrics.json``'s (see above)."""
    if isinstance(return_value, Mapping):
        returned = scalar_metrics(return_value)
    else:
        number = as_number(return_value)
        returned = {RETURN_METRIC: number} if number is not None else {}
    from_file = scalar_metrics(read_metrics_file(job_dir, since))
    return {**returned, **{k: v for k, v in from_file.items() if k not in returned}}


def metric_names(records: Iterable[JobRecord]) -> list[str]:
    """Every metric of the sweep, in the order jobs first reported them (so columns keep a stable order)."""
    return list(dict.fromkeys(name for r in records for name in r.metrics))


# -------------------------------------------------------------------------------------------- summary
def common_overrides(records: Sequence[JobRecord]) -> list[str]:
    """Overrides every job shares: said once instead of on every row."""
    if len(records) < 2:
        return []
    shared = set.intersection(*(set(r.overrides) for r in records))
    return [o for o in records[0].overrides if o in shared]


def format_number(value: Optional[Number]) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 1e5 else f"{value:.4g}"


def table_rows(records: Sequence[JobRecord]) -> list[list[str]]:
    """Header and one row per job: the summary table's cells, shared by summary.md and report.html."""
    common = set(common_overrides(records))
    names = metric_names(records)
    rows = [["job", "overrides", "status", "wall (s)", "result / error", *names]]
    for r in records:
        shown = " ".join(o for o in r.overrides if o not in common) or "(none)"
        rows.append([str(r.job), shown, r.status, f"{r.wall_s:.1f}", r.result,
                     *(format_number(r.metrics.get(n)) for n in names)])
    return rows


def format_table(records: Sequence[JobRecord]) -> str:
    """The summary as a Markdown table; overrides shared by every job are left out of the table."""
    header, *body = table_rows(records)
    rows = [header, ["---"] * len(header), *body]
    return "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)


def status_counts(records: Sequence[JobRecord]) -> dict[str, int]:
    counts = {s: sum(r.status == s for r in records) for s in ("COMPLETED", "FAILED", "SKIPPED")}
    unknown = sum(r.status == "UNKNOWN" for r in records)  # jobs rebuilt from their dirs only
    return {**counts, "UNKNOWN": unknown} if unknown else counts


def strict_json(value: Any) -> Any:
    """NaN and infinities as null: json.dumps would write bare ``NaN``, which strict JSON readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value


def write_summary(records: Sequence[JobRecord], sweep_dir: Path) -> None:
    counts = status_counts(records)
    head = f"# dsconf sweep summary\n\n{len(records)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    (sweep_dir / "summary.md").write_text(head + "\n\n" + format_table(records) + "\n", encoding="utf-8")
    data = {"jobs": [asdict(r) for r in records], "counts": counts, "metrics": metric_names(records)}
    (sweep_dir / "summary.json").write_text(json.dumps(strict_json(data), indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------- reading back
def load_records(sweep_dir: Path) -> list[JobRecord]:
    """The sweep's jobs from its ``summary.json``, else rebuilt from its job dirs (``summary=false``, or a
    sweep run by another launcher); SweepDirError when ``sweep_dir`` holds neither."""
    if not sweep_dir.exists():
        raise SweepDirError(f"{sweep_dir}: no such directory")
    if not sweep_dir.is_dir():
        raise SweepDirError(f"{sweep_dir}: not a directory")
    summary = sweep_dir / "summary.json"
    if summary.is_file():
        return _records_from_summary(summary)
    try:
        records = _records_from_job_dirs(sweep_dir)
    except OSError as err:
        raise SweepDirError(f"{sweep_dir}: not readable ({err.strerror or err})") from None
    if not records:
        raise SweepDirError(f"{sweep_dir}: not a sweep dir (no summary.json, and no job dirs with "
                            ".hydra/overrides.yaml)")
    return records


def _records_from_summary(path: Path) -> list[JobRecord]:
    try:
        jobs = json.loads(path.read_text(encoding="utf-8"))["jobs"]
        known = {f.name for f in fields(JobRecord)}
        # summaries written before metrics existed have no "metrics": the dataclass default fills it in
        records = [JobRecord(**{k: v for k, v in job.items() if k in known}) for job in jobs]
        for r in records:  # null in the file stands for NaN or an infinity (see _strict_json)
            r.metrics = {k: float("nan") if v is None else v for k, v in r.metrics.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise SweepDirError(f"{path}: not a dsconf sweep summary ({type(err).__name__}: {err})") from None
    if not records:
        raise SweepDirError(f"{path}: the sweep has no jobs")
    return records


def _records_from_job_dirs(sweep_dir: Path) -> list[JobRecord]:
    import yaml  # PyYAML comes with OmegaConf

    dirs = [d for d in sweep_dir.iterdir() if (d / ".hydra" / "overrides.yaml").is_file()]
    dirs.sort(key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))
    records = []
    for i, job_dir in enumerate(dirs):
        try:
            overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8")) or []
        except (OSError, yaml.YAMLError) as err:
            raise SweepDirError(f"{job_dir}/.hydra/overrides.yaml: not readable ({err})") from None
        records.append(JobRecord(job=int(job_dir.name) if job_dir.name.isdigit() else i,
                                 overrides=[str(o) for o in overrides], status="UNKNOWN", job_dir=str(job_dir),
                                 metrics=job_metrics(None, job_dir)))
    return records


def _job_dir(record: JobRecord, sweep_dir: Path) -> Path:
    """Where the job's files are now: the recorded dir, else the same job number under a moved sweep dir."""
    if record.job_dir and Path(record.job_dir).is_dir():
        return Path(record.job_dir)
    return sweep_dir / str(record.job)


# --------------------------------------------------------------------------------------------- report
@dataclass
class Report:
    path: Path
    jobs: int
    metric_plots: int
    curve_plots: int


def swept_parameters(records: Sequence[JobRecord]) -> list[str]:
    """The override keys whose values differ between jobs, in the order the jobs name them."""
    values: dict[str, set[str]] = {}
    for r in records:
        keys = dict(_split_override(o) for o in r.overrides)
        for key in values.keys() | keys.keys():
            values.setdefault(key, set()).add(keys.get(key, ""))
    order = list(dict.fromkeys(_split_override(o)[0] for r in records for o in r.overrides))
    return [key for key in order if len(values.get(key, ())) > 1]


def varying_metrics(records: Sequence[JobRecord]) -> tuple[list[str], dict[str, Number]]:
    """(metrics whose finite values differ between jobs, {metric: value} of those every job that has them shares)."""
    varying, constant = [], {}
    for name in metric_names(records):
        seen = {r.metrics[name] for r in records if name in r.metrics and math.isfinite(r.metrics[name])}
        if len(seen) > 1:
            varying.append(name)
        elif seen:
            constant[name] = next(iter(seen))
    return varying, constant


def _split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def write_report(sweep_dir: Union[str, os.PathLike]) -> Report:
    """Write ``<sweep_dir>/report.html``: the summary table; each metric that varies between jobs plotted against the
    swept parameters (the first along the axis, the others as groups), beside the curves (per-step losses) of the
    completed jobs' ``metrics.json``; the metrics every job shares, listed. One self-contained file (images inline).
    """
    from dsconf.launch.plots import Plotter, figure_html, html_page, table_html

    sweep_dir = Path(sweep_dir)
    records = load_records(sweep_dir)
    names, constant = varying_metrics(records)
    # a FAILED job's metrics.json may be left over from an earlier run: its curve could mislead
    curves: dict[str, dict[int, Curve]] = {}
    for r in records:
        if r.status in ("COMPLETED", "UNKNOWN"):
            for key, points in curves_of(read_metrics_file(_job_dir(r, sweep_dir))).items():
                curves.setdefault(key, {})[r.job] = points
    swept = swept_parameters(records)
    figures: list[str] = []
    if names or curves:
        plot = Plotter()
        labels = _job_labels(records)
        for key, by_job in curves.items():
            series = {labels[job]: points for job, points in by_job.items()}
            figures.append(figure_html(f"{key} per step", plot.curves(key, "step", key, series)))
        for name in names:
            title, image = _metric_plot(plot, name, records, swept)
            figures.append(figure_html(title, image))
    path = sweep_dir / REPORT_FILE
    esc = html.escape
    counts = ", ".join(f"{n} {s}" for s, n in status_counts(records).items())
    body = ["<h1>dsconf sweep report</h1>",
            f"<p><code>{esc(str(sweep_dir.resolve()))}</code>: {len(records)} jobs: {esc(counts)}</p>"]
    common = common_overrides(records)
    if common:
        body.append(f"<p>Every job: <code>{esc(' '.join(common))}</code></p>")
    rows = table_rows(records)
    body += ["<h2>Jobs</h2>", *table_html(rows, status_col=rows[0].index("status"))]
    if figures:
        body += ["<h2>Plots</h2>", f"<p>{_plotted_text(names, swept)}</p>", '<div class="plots">', *figures,
                 "</div>"]
    else:
        body.append("<p>No job left numbers behind: no numeric return value, no metrics.json.</p>"
                    if not constant else "<p>No metric differs between the jobs.</p>")
    if constant:
        shared = ", ".join(f"{k} = {format_number(v)}" for k, v in constant.items())
        body.append(f"<p>The same in every job (not plotted): {esc(shared)}</p>")
    try:
        path.write_text(html_page(f"dsconf sweep report: {sweep_dir.name}", body), encoding="utf-8")
    except OSError as err:
        raise SweepDirError(f"{path}: cannot write the report ({err.strerror or err})") from None
    return Report(path, len(records), len(names), len(curves))


def _job_labels(records: Sequence[JobRecord]) -> dict[int, str]:
    common = set(common_overrides(records))
    return {r.job: " ".join([f"#{r.job}", *(o for o in r.overrides if o not in common)]) for r in records}


def _metric_plot(plot: Any, name: str, records: Sequence[JobRecord], swept: Sequence[str]) -> tuple[str, str]:
    """One metric against the swept parameters: the first along the axis, the rest as groups; without swept
    parameters (jobs alike but for their number), by job."""
    values = []
    for r in records:
        if name not in r.metrics:
            continue
        keys = dict(_split_override(o) for o in r.overrides)
        if swept:
            x = keys.get(swept[0], "")
            group = " ".join(f"{k}={keys.get(k, '')}" for k in swept[1:])
        else:
            x, group = f"#{r.job}", ""
        values.append((x, group, float(r.metrics[name])))
    by = f" by {', '.join(swept)}" if swept else " by job"
    title = f"{name}{by}"
    return title, plot.grouped(title, name, swept[0] if swept else "job", values,
                               group_title=", ".join(swept[1:]))


def _plotted_text(names: Sequence[str], swept: Sequence[str]) -> str:
    if not names:
        return "Curves of the completed jobs."
    against = f"against {', '.join(swept)}" if swept else "by job"
    return f"Each metric that differs between jobs, {against}; the curves of the completed jobs."
