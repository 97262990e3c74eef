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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ["train.steps=1", "deepspeed.steps_per_print=1"]


def one_step_run(repo: Path, out: Path) -> float:
    env = {**os.environ, "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(p for p in [str(repo), os.environ.get("PYTHONPATH")] if p)}
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(repo / "examples" / "train.py"), *ARGS, f"hydra.run.dir={out}"],
                          cwd=str(repo), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{repo}: the example failed:\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-startup-"))
    base = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=REPO, check=True,
                   capture_output=True)
    try:
        one_step_run(base, work / "run"), one_step_run(REPO, work / "run")  # warm the file cache
        ratios = []
        for index in range(args.rounds):
            first, second = (base, REPO) if index % 2 == 0 else (REPO, base)
            seconds = {first: one_step_run(first, work / "run"), second: one_step_run(second, work / "run")}
            ratios.append(seconds[REPO] / seconds[base])
        ordered = sorted(ratios)
        p10, p90 = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(round(0.9 * (len(ordered) - 1)))]
        print(f"examples/train.py to the end of its first step: this tree / {args.baseline}, {args.rounds} "
              f"interleaved rounds, {os.cpu_count()} CPUs")
        print(f"median {statistics.median(ratios):.3f}x  (p10 {p10:.3f}x, p90 {p90:.3f}x)")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
