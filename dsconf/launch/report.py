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
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
RETURN_METRIC = "return"  # the column of a return value that is a plain number
REPORT_FILE = "report.html"
# A metrics.json whose mtime is this much before the job started is taken as left over from an earlier run
# in the same dir; the slack covers file systems that store mtimes at a coarse granularity.
MTIME_SLACK_S = 2.0
MAX_LABELLED_JOBS = 16  # up to this many jobs, a metric plot's x axis names each job by its overrides

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


class MissingExtraError(ImportError):
    """matplotlib, from the ``dsconf[report]`` extra, is needed to draw the plots and is not installed."""


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


def _strict_json(value: Any) -> Any:
    """NaN and infinities as null: json.dumps would write bare ``NaN``, which strict JSON readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict_json(v) for v in value]
    return value


def write_summary(records: Sequence[JobRecord], sweep_dir: Path) -> None:
    counts = status_counts(records)
    head = f"# dsconf sweep summary\n\n{len(records)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    (sweep_dir / "summary.md").write_text(head + "\n\n" + format_table(records) + "\n", encoding="utf-8")
    data = {"jobs": [asdict(r) for r in records], "counts": counts, "metrics": metric_names(records)}
    (sweep_dir / "summary.json").write_text(json.dumps(_strict_json(data), indent=2) + "\n", encoding="utf-8")


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


def write_report(sweep_dir: Union[str, os.PathLike]) -> Report:
    """Write ``<sweep_dir>/report.html``: the summary table, one plot per metric across jobs, and the curves
    (per-step losses) of the completed jobs' ``metrics.json``; one self-contained file (images inline)."""
    sweep_dir = Path(sweep_dir)
    records = load_records(sweep_dir)
    names = metric_names(records)
    # a FAILED job's metrics.json may be left over from an earlier run: its curve could mislead
    curves: dict[str, dict[int, Curve]] = {}
    for r in records:
        if r.status in ("COMPLETED", "UNKNOWN"):
            for key, points in curves_of(read_metrics_file(_job_dir(r, sweep_dir))).items():
                curves.setdefault(key, {})[r.job] = points
    metric_images: list[tuple[str, str]] = []
    curve_images: list[tuple[str, str]] = []
    if names or curves:
        plot = _Plotter(records)
        metric_images = [(f"{n} across jobs", plot.metric(n)) for n in names]
        curve_images = [(f"{key} per step", plot.curve(key, by_job)) for key, by_job in curves.items()]
    path = sweep_dir / REPORT_FILE
    try:
        path.write_text(_html(sweep_dir, records, metric_images, curve_images), encoding="utf-8")
    except OSError as err:
        raise SweepDirError(f"{path}: cannot write the report ({err.strerror or err})") from None
    return Report(path, len(records), len(names), len(curves))


class _Plotter:
    """matplotlib's object API with the Agg canvas: no pyplot, so no global backend switch in the caller's
    process (a notebook keeps its own), and no display needed."""

    def __init__(self, records: Sequence[JobRecord]) -> None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib.ticker import MaxNLocator
        except ImportError:
            raise MissingExtraError("the plots need matplotlib: pip install 'dsconf[report]'") from None
        self._figure, self._canvas, self._locator = Figure, FigureCanvasAgg, MaxNLocator
        self.records = list(records)
        common = set(common_overrides(records))
        self.labels = {r.job: " ".join([f"#{r.job}", *(o for o in r.overrides if o not in common)])
                       for r in self.records}

    def metric(self, name: str) -> str:
        points = [(r.job, r.metrics[name]) for r in self.records
                  if name in r.metrics and math.isfinite(r.metrics[name])]
        fig, ax = self._axes()
        if points:
            jobs, values = zip(*points)
            ax.plot(jobs, values, "o", markersize=7)
        else:  # every value NaN or infinite (a diverged metric): say so rather than show empty axes
            ax.text(0.5, 0.5, "no finite value", transform=ax.transAxes, ha="center", va="center")
        ax.set(title=name, ylabel=name)
        ax.ticklabel_format(axis="y", useOffset=False)  # jobs differing in the 5th digit: values, not "1e-5+4.275"
        # every job has its place on the axis, values or not, so that plots of different metrics line up
        numbers = sorted(r.job for r in self.records)
        ax.set_xlim(numbers[0] - 0.5, numbers[-1] + 0.5)
        if len(numbers) <= MAX_LABELLED_JOBS:  # few jobs: name each by its overrides, not only its number
            ax.set_xticks(numbers, [self.labels[n] for n in numbers], rotation=20, ha="right", fontsize="small")
        else:
            ax.xaxis.set_major_locator(self._locator(integer=True))
            ax.set_xlabel("job")
        return self._png(fig)

    def curve(self, key: str, by_job: Mapping[int, Curve]) -> str:
        fig, ax = self._axes()
        for job, points in by_job.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="." if len(points) < 50 else None, label=self.labels.get(job, f"#{job}"))
        ax.set(title=key, xlabel="step", ylabel=key)
        ax.legend(fontsize="small")
        return self._png(fig)

    def _axes(self) -> tuple[Any, Any]:
        fig = self._figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
        self._canvas(fig)
        ax = fig.add_subplot()
        ax.grid(True, alpha=0.3)
        return fig, ax

    @staticmethod
    def _png(fig: Any) -> str:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #e8eef7; }
td.COMPLETED { background: #e3f4e1; } td.FAILED { background: #fbe1e1; } td.SKIPPED { background: #eee; }
figure { display: inline-block; margin: 0.5em; }
"""


def _html(sweep_dir: Path, records: Sequence[JobRecord], metric_images: Sequence[tuple[str, str]],
          curve_images: Sequence[tuple[str, str]]) -> str:
    esc = html.escape
    counts = ", ".join(f"{n} {s}" for s, n in status_counts(records).items())
    header, *body = table_rows(records)
    status_col = header.index("status")
    rows = ["<tr>" + "".join(f"<th>{esc(c)}</th>" for c in header) + "</tr>"]
    for row in body:
        cells = [f'<td class="{esc(c)}">{esc(c)}</td>' if i == status_col else f"<td>{esc(c)}</td>"
                 for i, c in enumerate(row)]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    common = common_overrides(records)
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>dsconf sweep report: {esc(sweep_dir.name)}</title>", f"<style>{_STYLE}</style>", "</head>",
        "<body>", "<h1>dsconf sweep report</h1>",
        f"<p><code>{esc(str(sweep_dir.resolve()))}</code>: {len(records)} jobs: {esc(counts)}</p>",
    ]
    if common:
        parts.append(f"<p>Every job: <code>{esc(' '.join(common))}</code></p>")
    parts += ["<h2>Jobs</h2>", "<table>", *rows, "</table>"]
    if not metric_images and not curve_images:
        parts.append("<p>No job left numbers behind: no numeric return value, no metrics.json.</p>")
    for heading, images in (("Metrics across jobs", metric_images), ("Curves", curve_images)):
        if images:
            parts.append(f"<h2>{heading}</h2>")
        for title, data in images:
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{esc(title)}" '
                         f'title="{esc(title)}"></figure>')
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"
