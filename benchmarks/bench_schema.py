"""What the schema of every DeepSpeed section costs, as paired ratios measured in one run.

    python benchmarks/bench_schema.py [--rounds N] [--baseline REV]

This machine is noisy, so each measurement and its baseline run alternately, one after the other, and the
report is the median of the per-round ratios with their spread (the 10th and 90th percentiles):

(a) compose+validate+export of the default and the full config, this tree against REV (a git worktree made for
    the run; default: main before dsconf modelled every DeepSpeed section). Each side runs in its own long-lived
    process; the parent asks them in turn.
(b) dsconf's own work on top of Hydra's: compose+validate+export against Hydra composing the same config.
(c) ``dsconf validate`` of 100 files in one process against DeepSpeed's ``DeepSpeedConfig`` parse of the same
    files, ``import deepspeed`` included; both as fresh processes (wall time).
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
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "8435265"  # main before every DeepSpeed section was modelled
DEFAULT = ["deepspeed.train_micro_batch_size_per_gpu=8"]
FULL = ["precision=bf16", "zero=stage3_offload", "optimizer=adamw", "scheduler=warmup_cosine",
        "activation_checkpointing=partitioned", "deepspeed.train_batch_size=64",
        "deepspeed.gradient_accumulation_steps=2", "deepspeed.scheduler.params.total_num_steps=1000",
        "deepspeed.steps_per_print=10", "dist.nproc_per_node=4"]
CASES = {"default": DEFAULT, "full": FULL}

# A worker: reads a case name per line, composes+validates+exports it, answers the seconds it took.
WORKER = r"""
import json, sys, time, warnings
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
import dsconf
from dsconf.composition import compose_config
cases = json.loads(sys.argv[2])
for name in cases:
    dsconf.compose(cases[name])  # warm imports and caches
print("ready", flush=True)
for line in sys.stdin:
    name, what = line.split()
    start = time.perf_counter()
    if what == "dsconf":
        dsconf.compose(cases[name])
    else:
        compose_config(cases[name])
    print(time.perf_counter() - start, flush=True)
"""


class Worker:
    def __init__(self, tree: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), json.dumps(CASES)], cwd=tree,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(tree)})
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def time(self, case: str, what: str = "dsconf") -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{case} {what}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()


def paired(measure: Callable[[], float], baseline: Callable[[], float], rounds: int) -> Dict[str, float]:
    """Median and spread of measure/baseline, the two alternating (which goes first alternates too)."""
    ratios, ours, theirs = [], [], []
    for i in range(rounds):
        if i % 2:
            b, a = baseline(), measure()
        else:
            a, b = measure(), baseline()
        ratios.append(a / b)
        ours.append(a)
        theirs.append(b)
    ratios.sort()
    return {"ratio": statistics.median(ratios), "p10": ratios[len(ratios) // 10],
            "p90": ratios[(len(ratios) * 9) // 10], "ms": statistics.median(ours) * 1000,
            "baseline_ms": statistics.median(theirs) * 1000}


def worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="dsconf-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True,
                   capture_output=True)
    return path


def files_for_validate(count: int) -> List[str]:
    sys.path.insert(0, str(ROOT))
    from dsconf.validate_files import check_file

    corpus = sorted(p for p in (ROOT / "tests" / "corpus").glob("*.json"))
    valid = [str(p) for p in corpus if check_file(str(p), keep_auto=True).ok]
    return [valid[i % len(valid)] for i in range(count)]


PARSE_ALL = r"""
import json, sys, warnings
from unittest import mock
import deepspeed.runtime.config as ds_config
with mock.patch.object(ds_config.dist, "get_world_size", return_value=1), \
        mock.patch.object(ds_config.dist, "get_rank", return_value=0):
    for path in sys.argv[1:]:
        try:
            ds_config.DeepSpeedConfig(path)
        except Exception:
            pass
"""


def wall(cmd: List[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, capture_output=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    return time.perf_counter() - start


def report(label: str, result: Dict[str, float]) -> None:
    print(f"{label:<62} {result['ms']:9.1f} {result['baseline_ms']:9.1f}   {result['ratio']:5.2f}x "
          f"[{result['p10']:.2f}-{result['p90']:.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--skip-validate", action="store_true")
    args = parser.parse_args()

    print(f"{'measurement (median of paired ratios, [p10-p90])':<62} {'ms':>9} {'base ms':>9}   ratio")
    base_tree = worktree(args.baseline)
    try:
        ours, theirs = Worker(ROOT), Worker(base_tree)
        for case in CASES:
            report(f"(a) compose+validate+export, {case}: this tree / {args.baseline}",
                   paired(lambda c=case: ours.time(c), lambda c=case: theirs.time(c), args.rounds))
        for case in CASES:
            report(f"(b) compose+validate+export / Hydra compose, {case}",
                   paired(lambda c=case: ours.time(c), lambda c=case: ours.time(c, "hydra"), args.rounds))
        ours.close()
        theirs.close()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(base_tree, ignore_errors=True)
    if not args.skip_validate:
        files = files_for_validate(100)
        validate = [sys.executable, "-m", "dsconf.cli", "validate", "--keep-auto", *files]
        parse = [sys.executable, "-c", PARSE_ALL, *files]
        rounds = max(args.rounds // 3, 5)
        result = paired(lambda: wall(validate), lambda: wall(parse), rounds)
        report("(c) dsconf validate of 100 files / import deepspeed + parse", result)


if __name__ == "__main__":
    main()
