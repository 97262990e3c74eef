"""Training throughput of the example through dsconf vs. the same model and DeepSpeed config under torchrun.

    python benchmarks/bench_train.py [--steps 150] [--repeat 5] [--ranks 1 2] [--override dist.start_method=spawn ...]

For each world size N, runs alternate (so that load drifting on the machine hits both alike):

- dsconf:   ``python examples/train.py dist.nproc_per_node=N train.steps=S hydra.run.dir=...``
- torchrun: ``torchrun --standalone --nproc_per_node N benchmarks/baseline_train.py --ds-config <ds_config.json>``,
  a hand-written script with the same model and loop (``examples/training.py``) and the very DeepSpeed dict
  dsconf saved for its run.

Reported per launcher: samples/s over every step but the first (from each run's ``metrics.json``) and the wall
time of the whole command (start-up, DeepSpeed initialisation, training, exit); medians of ``--repeat`` runs,
then the ratios dsconf / torchrun. The goal is parity within 2%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
BASELINE = REPO / "benchmarks" / "baseline_train.py"


@dataclass
class Runs:
    samples_per_second: List[float] = field(default_factory=list)
    wall_s: List[float] = field(default_factory=list)

    def add(self, metrics: Dict[str, float], wall: float) -> None:
        self.samples_per_second.append(float(metrics["samples_per_second"]))
        self.wall_s.append(wall)


def run(cmd: List[str], out_dir: Path, env: Dict[str, str]) -> tuple[Dict[str, float], float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(out_dir.parent), env=env, text=True, capture_output=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    with open(out_dir / "metrics.json", encoding="utf-8") as fh:
        return json.load(fh), wall


def dsconf_cmd(ranks: int, steps: int, out_dir: Path, overrides: List[str]) -> List[str]:
    return [sys.executable, str(TRAIN), f"dist.nproc_per_node={ranks}", f"train.steps={steps}",
            f"hydra.run.dir={out_dir}", *overrides]


def torchrun_cmd(ranks: int, steps: int, ds_config: Path, out_dir: Path) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            str(BASELINE), "--ds-config", str(ds_config), "--steps", str(steps), "--out", str(out_dir)]


def bench(ranks: int, steps: int, repeat: int, work: Path, env: Dict[str, str],
          overrides: List[str]) -> Dict[str, Runs]:
    # an untimed dsconf run first: warms the page cache, and saves the ds_config.json both launchers use
    first = work / f"ranks{ranks}-warmup"
    run(dsconf_cmd(ranks, steps, first, overrides), first, env)
    ds_config = work / f"ranks{ranks}-ds_config.json"
    shutil.copy(first / "ds_config.json", ds_config)
    runs = {"dsconf": Runs(), "torchrun": Runs()}
    for i in range(repeat):
        order = ["dsconf", "torchrun"] if i % 2 == 0 else ["torchrun", "dsconf"]
        for launcher in order:
            out = work / f"ranks{ranks}-{launcher}-{i}"
            if launcher == "dsconf":
                cmd = dsconf_cmd(ranks, steps, out, overrides)
            else:
                cmd = torchrun_cmd(ranks, steps, ds_config, out)
            runs[launcher].add(*run(cmd, out, env))
            if launcher == "dsconf":
                saved = json.loads((out / "ds_config.json").read_text())
                assert saved == json.loads(ds_config.read_text()), "dsconf exported a different DeepSpeed config"
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--override", action="append", default=[],
                        help="extra override for the dsconf runs only (not DeepSpeed keys: both must use one config)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    import torch  # only to know whether DeepSpeed should use its CPU accelerator

    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-train-"))
    print(f"{args.steps} steps, median of {args.repeat} runs per launcher, {os.cpu_count()} CPUs, "
          f"DS_ACCELERATOR={env.get('DS_ACCELERATOR', 'auto')}, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}"
          + (f", dsconf overrides: {' '.join(args.override)}" if args.override else ""))
    header = f"{'ranks':>5}  {'launcher':<9} {'samples/s':>10} {'wall s':>8}   each run (samples/s | wall s)"
    print(header)
    print("-" * len(header))
    try:
        for ranks in args.ranks:
            runs = bench(ranks, args.steps, args.repeat, work, env, args.override)
            med = {k: (statistics.median(r.samples_per_second), statistics.median(r.wall_s)) for k, r in runs.items()}
            for launcher, r in runs.items():
                each = " ".join(f"{s:.0f}" for s in r.samples_per_second) + " | " + " ".join(
                    f"{w:.1f}" for w in r.wall_s)
                print(f"{ranks:>5}  {launcher:<9} {med[launcher][0]:>10.1f} {med[launcher][1]:>8.2f}   {each}")
            sps = med["dsconf"][0] / med["torchrun"][0]
            wall = med["dsconf"][1] / med["torchrun"][1]
            print(f"{ranks:>5}  {'ratio':<9} {sps:>10.3f} {wall:>8.3f}   dsconf / torchrun "
                  f"(samples/s {100 * (sps - 1):+.1f}%, wall {100 * (wall - 1):+.1f}%)", flush=True)
    finally:
        if args.keep:
            print(f"runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
