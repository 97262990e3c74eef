"""What the benchmarks that compare this tree with a git revision share: the baseline's worktree, the environment that
runs a tree's code, the interleaved rounds, and how their paired ratios are reported."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

REPO = Path(__file__).resolve().parents[1]


def tree_env(repo: Path, **extra: str) -> Dict[str, str]:
    """The environment in which a command runs ``repo``'s dsconf (on DeepSpeed's CPU accelerator)."""
    return {**os.environ, "DS_ACCELERATOR": "cpu", **extra,
            "PYTHONPATH": os.pathsep.join(p for p in [str(repo), os.environ.get("PYTHONPATH")] if p)}


@contextlib.contextmanager
def baseline_tree(revision: str, prefix: str) -> Iterator[Tuple[Path, Path]]:
    """(a scratch dir, a worktree of ``revision`` in it), both removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    base = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), revision], cwd=REPO, check=True,
                   capture_output=True)
    try:
        yield work, base
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def interleaved(rounds: int, base: Path, measure: Callable[[Path], float]) -> Tuple[List[float], List[float]]:
    """``measure`` of each tree once a round, alternating which goes first (load drifting on the machine hits both
    alike), after one unmeasured run of each (file cache, bytecode): (ratios this tree / base, this tree's values)."""
    measure(base), measure(REPO)
    ratios, ours = [], []
    for index in range(rounds):
        order = (base, REPO) if index % 2 == 0 else (REPO, base)
        values = {tree: measure(tree) for tree in order}
        ratios.append(values[REPO] / values[base])
        ours.append(values[REPO])
    return ratios, ours


def spread(ratios: List[float]) -> str:
    """The median of paired ratios with their 10th and 90th percentiles."""
    ordered = sorted(ratios)
    p10, p90 = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(ratios):.3f}x  (p10 {p10:.3f}x, p90 {p90:.3f}x)"
