"""Start-up cost of the example's command line: this tree against a git revision, interleaved run by run.

    python benchmarks/bench_startup.py --baseline REV [--rounds 10]

Each round runs ``python examples/train.py train.steps=1`` once from each tree (alternating which goes first,
so that load drifting on the machine hits both alike) and times the whole command: with one step, that is the
start-up (imports, composition, validation, rank start, DeepSpeed initialisation) plus one step and exit.
Reported: the median of the paired ratios this tree / baseline, with p10 and p90.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from paired import baseline_tree, interleaved, spread, tree_env

ARGS = ["train.steps=1", "deepspeed.steps_per_print=1"]


def one_step_run(repo: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(repo / "examples" / "train.py"), *ARGS, f"hydra.run.dir={out}"],
                          cwd=str(repo), env=tree_env(repo), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{repo}: the example failed:\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with baseline_tree(args.baseline, "dsconf-bench-startup-") as (work, base):
        ratios, _ = interleaved(args.rounds, base, lambda tree: one_step_run(tree, work / "run"))
        print(f"examples/train.py to the end of its first step: this tree / {args.baseline}, {args.rounds} "
              f"interleaved rounds, {os.cpu_count()} CPUs")
        print(spread(ratios))


if __name__ == "__main__":
    main()
