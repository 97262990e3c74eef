"""The tuner against a full grid over the same space, in one run.

    python benchmarks/bench_tune.py [--nproc 2] [--n-trials 8] [--top-k 1] [--override model.hidden=768 ...]

Both run ``examples/train.py -m hydra/sweeper=dsconf_tune`` over ZeRO stages 0-3 x offload {none, optimizer, all} x
micro batch {1, 2, 4, 8} (32 candidates; global batch 8 x ranks), with the same trial length:

- the grid: every candidate measured (``hydra.sweeper.n_trials`` = the number of candidates, ``top_k=0``, a memory
  limit no candidate reaches, so the prior prunes nothing);
- the tuner: as a user runs it, with a budget of ``--n-trials`` trials and ``--top-k`` re-runs.

Reported: each run's wall time (the whole command), the grid's best candidate and throughput, the tuner's winner and
its throughput as the grid measured it (the same measurement for both picks, so run-to-run noise does not decide),
and whether the tuner's pick is within 5% of the grid's best in at most 40% of the grid's wall time. The two sweep
dirs stay under ``--out`` (trials.json, summary.md, report.html).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
STAGES, OFFLOADS, MICRO = [0, 1, 2, 3], ["none", "optimizer", "all"], [1, 2, 4, 8]


def study(out: Path, nproc: int, steps: int, warmup: int, extra: List[str], overrides: List[str]) -> float:
    cmd = [sys.executable, str(TRAIN), "-m", "hydra/sweeper=dsconf_tune", f"dist.nproc_per_node={nproc}",
           f"deepspeed.train_micro_batch_size_per_gpu={max(MICRO)}", f"hydra.sweeper.steps={steps}",
           f"hydra.sweeper.warmup_steps={warmup}", f"hydra.sweeper.space.stage=[{','.join(map(str, STAGES))}]",
           f"hydra.sweeper.space.offload=[{','.join(OFFLOADS)}]",
           f"hydra.sweeper.space.micro_batch=[{','.join(map(str, MICRO))}]", *extra, *overrides,
           "train.steps=100000",  # the trial stops it after warmup + steps
           f"hydra.sweep.dir={out}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(out.parent), env=env, text=True, capture_output=True)
    wall = time.perf_counter() - start
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    return wall


def throughputs(sweep_dir: Path) -> Dict[str, float]:
    return {t["candidate"]: t["samples_per_s"] for t in json.loads((sweep_dir / "trials.json").read_text())
            if t["status"] == "ok" and t["samples_per_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="where the two sweep dirs go (default: a temporary dir)")
    parser.add_argument("--override", nargs="*", default=["model.hidden=64", "model.layers=2"],
                        help="overrides for both runs (the model's size)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-tune-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    candidates = sum(len(MICRO) for s in STAGES for o in OFFLOADS if o == "none" or (s > 0 and (o != "all" or s == 3)))
    tuner_wall = study(out / "tuner", args.nproc, args.steps, args.warmup_steps,
                       [f"hydra.sweeper.n_trials={args.n_trials}", f"hydra.sweeper.top_k={args.top_k}"], args.override)
    grid_wall = study(out / "grid", args.nproc, args.steps, args.warmup_steps,
                      [f"hydra.sweeper.n_trials={candidates}", "hydra.sweeper.top_k=0",
                       "hydra.sweeper.memory_limit=1TiB"], args.override)
    grid = throughputs(out / "grid")
    tuner_trials = json.loads((out / "tuner" / "trials.json").read_text())
    winner = next(t for t in tuner_trials if t["winner"])
    measured = sum(t["job"] is not None for t in tuner_trials)
    best_key = max(grid, key=grid.__getitem__)
    ratio, wall_ratio = grid.get(winner["candidate"], 0.0) / grid[best_key], tuner_wall / grid_wall
    print(f"space: {candidates} candidates, {args.nproc} rank(s), {args.steps} timed steps after {args.warmup_steps}")
    print(f"grid:  {len(grid)} measured in {grid_wall:.0f} s; best {best_key}: {grid[best_key]:.1f} samples/s")
    print(f"tuner: {measured} trials (+{args.top_k} re-runs) in {tuner_wall:.0f} s; winner {winner['candidate']}: "
          f"{winner['samples_per_s']:.1f} samples/s in its own trial, {grid.get(winner['candidate'], 0):.1f} in "
          f"the grid's")
    print(f"tuner's pick / grid's best: {ratio:.3f} (goal >= 0.95); wall tuner / grid: {wall_ratio:.2f} "
          f"(goal <= 0.40)")
    print(f"sweep dirs: {out}")
    return 0 if ratio >= 0.95 and wall_ratio <= 0.40 else 1


if __name__ == "__main__":
    sys.exit(main())
