"""The drawing behind ``dsconf report`` and the tuner's ``report.html``: matplotlib figures as inline PNGs.

matplotlib's object API with the Agg canvas: no pyplot, so no global backend switch in the caller's process (a
notebook keeps its own), and no display needed. matplotlib is imported when a ``Plotter`` is made (the
``dsconf[report]`` extra); without it, ``MissingExtraError`` names the extra.

- ``grouped``: one value per (x, group) as grouped bars: a metric by the swept parameters, a step time by stage;
- ``curves``: y against x per series (per-step losses);
- ``scatter``: labelled point sets, an optional front drawn through some of them and vertical reference lines
  (the tuner's throughput against peak memory).
- ``html_page``: a self-contained page (no script, nothing fetched) around the tables and figures.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

Point = Tuple[float, float]


class MissingExtraError(ImportError):
    """matplotlib, from the ``dsconf[report]`` extra, is needed to draw the plots and is not installed."""


@dataclass
class PointSet:
    label: str
    points: List[Point]
    marker: str = "o"
    color: Optional[str] = None
    hollow: bool = False
    notes: List[str] = field(default_factory=list)  # one text per point, drawn beside it


class Plotter:
    def __init__(self) -> None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise MissingExtraError("the plots need matplotlib: pip install 'dsconf[report]'") from None
        self._figure, self._canvas = Figure, FigureCanvasAgg

    def grouped(self, title: str, ylabel: str, xlabel: str, values: Sequence[Tuple[str, str, float]],
                group_title: str = "") -> str:
        """``(x, group, value)``: x categories along the axis, one bar per group inside each (first-seen order), one
        legend entry per group; a non-finite value leaves its bar out. Values far from zero and close together
        (losses) are drawn as points on an axis fitted to them, where bars from zero would all look alike."""
        xs = list(dict.fromkeys(x for x, _, _ in values))
        groups = list(dict.fromkeys(g for _, g, _ in values))
        fig, ax = self._axes()
        width = 0.8 / max(1, len(groups))
        finite = [v for _, _, v in values if math.isfinite(v)]
        bars = not finite or min(finite) <= 0 or min(finite) < 0.5 * max(finite)
        for gi, group in enumerate(groups):
            at = {x: v for x, g, v in values if g == group and math.isfinite(v)}
            positions = [xs.index(x) - 0.4 + width * (gi + 0.5) for x in xs if x in at]
            heights = [at[x] for x in xs if x in at]
            if bars:
                ax.bar(positions, heights, width=width * 0.92, label=group or None)
            else:
                ax.plot(positions, heights, "o", markersize=8, label=group or None)
        if not finite:
            ax.text(0.5, 0.5, "no finite value", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks(range(len(xs)), xs, rotation=15 if max((len(x) for x in xs), default=0) > 12 else 0,
                      ha="right" if max((len(x) for x in xs), default=0) > 12 else "center", fontsize="small")
        ax.set(title=title, ylabel=ylabel, xlabel=xlabel)
        ax.ticklabel_format(axis="y", useOffset=False)
        if finite and bars and min(finite) >= 0:
            ax.set_ylim(0, max(finite) * 1.12 or 1)
        if any(groups):
            ax.legend(fontsize="small", title=group_title or None, title_fontsize="small")
        return self.png(fig)

    def curves(self, title: str, xlabel: str, ylabel: str, series: Mapping[str, Sequence[Point]]) -> str:
        fig, ax = self._axes()
        for label, points in series.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="." if len(points) < 50 else None, label=label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize="small")
        return self.png(fig)

    def scatter(self, title: str, xlabel: str, ylabel: str, sets: Sequence[PointSet], *,
                front: Sequence[Point] = (), front_label: str = "", vlines: Sequence[Tuple[float, str]] = (),
                xscale: float = 1.0) -> str:
        """Point sets (x divided by ``xscale`` for display); ``front`` drawn as a step line; dashed ``vlines``."""
        fig, ax = self._axes(width=7.6, height=4.4)
        for s in sets:
            if not s.points:
                continue
            xs = [x / xscale for x, _ in s.points]
            ys = [y for _, y in s.points]
            style: Dict[str, Any] = {"marker": s.marker, "s": 46, "label": s.label, "zorder": 3}
            if s.hollow:
                style.update(facecolors="none", edgecolors=s.color or "grey")
            else:
                style.update(color=s.color)
            ax.scatter(xs, ys, **style)
            for (x, y), note in zip(zip(xs, ys), s.notes):
                if note:
                    ax.annotate(note, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        if front:
            ordered = sorted(front)
            ax.step([x / xscale for x, _ in ordered], [y for _, y in ordered], where="post", color="black",
                    linewidth=1.2, alpha=0.7, label=front_label, zorder=2)
        for x, label in vlines:
            ax.axvline(x / xscale, color="red", linestyle="--", linewidth=1, label=label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="x-small", loc="best")
        return self.png(fig)

    def _axes(self, width: float = 6.4, height: float = 3.6) -> Tuple[Any, Any]:
        fig = self._figure(figsize=(width, height), dpi=100, layout="constrained")
        self._canvas(fig)
        ax = fig.add_subplot()
        ax.grid(True, alpha=0.3)
        return fig, ax

    @staticmethod
    def png(fig: Any) -> str:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def pareto_front(points: Sequence[Point]) -> List[Point]:
    """The points no other point beats on both counts: less x (memory) and more y (throughput)."""
    front: List[Point] = []
    best = -math.inf
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #e8eef7; }
td.COMPLETED, td.ok { background: #e3f4e1; } td.FAILED, td.failed { background: #fbe1e1; }
td.SKIPPED, td.pruned { background: #eee; } td.infeasible { background: #fdf0d5; }
.plots { display: flex; flex-wrap: wrap; align-items: flex-start; }
figure { display: inline-block; margin: 0.5em; }
figcaption { font-size: 0.85em; color: #555; max-width: 640px; }
"""


def table_html(rows: Sequence[Sequence[str]], status_col: Optional[int] = None) -> List[str]:
    """An HTML table: the first row is the header; the status column's cells get their status as class."""
    esc = html.escape
    header, *body = rows
    out = ["<table>", "<tr>" + "".join(f"<th>{esc(c)}</th>" for c in header) + "</tr>"]
    for row in body:
        cells = [f'<td class="{esc(c)}">{esc(c)}</td>' if i == status_col else f"<td>{esc(c)}</td>"
                 for i, c in enumerate(row)]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return out


def figure_html(title: str, data: str, caption: str = "") -> str:
    esc = html.escape
    text = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{esc(title)}" title="{esc(title)}">{text}'
            "</figure>")


def html_page(title: str, body: Sequence[str]) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>", *body,
             "</body>", "</html>"]
    return "\n".join(parts) + "\n"
