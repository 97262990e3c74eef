"""What DeepSpeed ranks cost to start through dsconf: the example's 2-rank job, a 4-job sweep of it and a 4-trial
tuning study of it (each trial a batch of its own), this tree against an earlier commit, as wall time and CPU time (the
command and everything it started).

    python benchmarks/bench_ranks.py --baseline REV [--rounds 5] [--case NAME ...]

Unlike bench_launch.py (a task that only joins a process group), these ranks do what every DeepSpeed rank does:
``deepspeed.initialize`` (its CPU communication op and its Adam, each an op load) and 30 training steps. Each round
runs both trees one after the other, alternating which goes first; the report is the median of the per-round ratios
(this tree / REV) with their 10th and 90th percentiles.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from paired import REPO, baseline_tree, interleaved, spread, tree_env

CASES = {
    "2-rank job": ["dist.nproc_per_node=2"],
    "4-job sweep of 2-rank jobs": ["-m", "zero=stage0,stage1", "precision=fp32,bf16", "dist.nproc_per_node=2"],
    "4-trial tuning study": ["-m", "hydra/sweeper=dsconf_tune", "dist.nproc_per_node=2", "hydra.sweeper.steps=5",
                             "hydra.sweeper.n_trials=4", "hydra.sweeper.top_k=0"],
}


def timed(repo: Path, args: List[str], out: Path) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children) of ``python examples/train.py ARGS``."""
    where = f"hydra.sweep.dir={out}" if "-m" in args else f"hydra.run.dir={out}"
    shutil.rmtree(out, ignore_errors=True)  # a tuning study in a dir it ran in before would continue, not run
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(repo / "examples" / "train.py"), *args, where], env=tree_env(repo),
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed in {repo}:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare this tree against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", nargs="*", choices=sorted(CASES), default=list(CASES), help="the cases to run")
    args = parser.parse_args()
    with baseline_tree(args.baseline, "dsconf-bench-ranks-") as (work, base):
        print(f"DeepSpeed ranks: this tree / {args.baseline}, {args.rounds} interleaved rounds, {os.cpu_count()} CPUs")
        for name in args.case:
            case = CASES[name]
            cpu: Dict[Path, List[float]] = {base: [], REPO: []}

            def wall_of(repo: Path, case: List[str] = case, cpu: Dict[Path, List[float]] = cpu) -> float:
                wall, seconds = timed(repo, case, work / "out")
                cpu[repo].append(seconds)
                return wall

            walls, _ = interleaved(args.rounds, base, wall_of)
            cpus = [ours / theirs for ours, theirs in zip(cpu[REPO][1:], cpu[base][1:])]  # the warm-up run is not kept
            print(f"{name:<28} wall {spread(walls)}")
            print(f"{'':<28} CPU  {spread(cpus)}")


if __name__ == "__main__":
    main()
