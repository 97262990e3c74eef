"""Launch overhead of dsconf against torchrun running an equivalent hand-written script.

    python benchmarks/bench_launch.py [--repeat 3]

(a) one 2-rank job: wall time from the command to the training function having started on every rank,
    ``python train.py dist.nproc_per_node=2`` vs ``torchrun --standalone --nproc_per_node 2 plain.py``
    (the plain script reads a hand-written ds_config.json);
(b) a sweep of 4 short 2-rank jobs: ``python train.py -m hydra/launcher=dsconf ...`` vs a shell loop of 4
    torchrun commands (total wall time);
(c) the same sweep with ``hydra.launcher.max_parallel_jobs=2`` vs the same torchrun loop.

Every ratio is dsconf / torchrun (goals: (a), (b) <= 1.0x; (c) < 0.6x); each figure is the median of
``--repeat`` runs.

    python benchmarks/bench_launch.py --baseline REV [--rounds N]

compares this tree against an earlier commit instead (a git worktree made for the run), as paired ratios:
each round runs the baseline and this tree one after the other, and the report is the median of the per-round
ratios (this tree / REV) with their 10th and 90th percentiles:

PF2  one 2-rank job, from the command to every rank in its training function (and the command's wall time);
PF3  a sequential sweep of 4 2-rank jobs, the command's wall time.

dsconf is measured with its config's default ``dist.start_method`` and, when that is not already ``auto``,
with ``dist.start_method=auto`` (fork on a host without GPUs, spawn with GPUs).
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
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]

DSCONF_SCRIPT = '''
import os, time
import torch
import torch.distributed as dist
import dsconf
from dsconf.launch import context


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    started = time.time()
    ds = context.deepspeed_config()
    out = os.environ["BENCH_OUT"]
    with open(os.path.join(out, f"entry-{cfg.bench.job}-{os.environ['RANK']}"), "w") as fh:
        fh.write(repr(started))
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()
    return ds["train_batch_size"]


if __name__ == "__main__":
    train()
'''

PLAIN_SCRIPT = '''
import argparse, json, os, time
import torch
import torch.distributed as dist


def train(args):
    started = time.time()
    with open(args.deepspeed_config) as fh:
        ds = json.load(fh)
    out = os.environ["BENCH_OUT"]
    with open(os.path.join(out, f"entry-{args.job}-{os.environ['RANK']}"), "w") as fh:
        fh.write(repr(started))
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()
    return ds["train_batch_size"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config")
    parser.add_argument("--job", default="0")
    train(parser.parse_args())
'''

DS_CONFIG = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
}

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=1"]


def timed(cmd: List[str], cwd: Path, out: Path, shell: bool = False, repo: Path = REPO) -> tuple[float, float]:
    """(seconds until every rank entered its training function, seconds until the command exited)."""
    for stale in out.glob("entry-*"):
        stale.unlink()
    env = {**os.environ, "BENCH_OUT": str(out), "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(p for p in [str(repo), os.environ.get("PYTHONPATH")] if p)}
    start = time.time()
    proc = subprocess.run(cmd if not shell else " ".join(cmd), cwd=str(cwd), env=env, shell=shell,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    total = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{proc.stderr[-3000:]}")
    entries = [float(p.read_text()) for p in out.glob("entry-*")]
    return max(entries) - start, total


def median_of(repeat: int, run: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    runs = [run() for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def paired(rounds: int, baseline: str) -> None:
    """PF2 and PF3: this tree against ``baseline``, interleaved round by round."""
    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-"))
    out = work / "entries"
    out.mkdir()
    (work / "train.py").write_text(DSCONF_SCRIPT)
    base = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), baseline], cwd=REPO, check=True,
                   capture_output=True)
    python = sys.executable

    def job(repo: Path) -> tuple[float, float]:
        return timed([python, "train.py", "dist.nproc_per_node=2", "+bench.job=0", *BATCH,
                      f"hydra.run.dir={work / 'run'}"], work, out, repo=repo)

    def sweep(repo: Path) -> tuple[float, float]:
        return timed([python, "train.py", "-m", "hydra/launcher=dsconf", "dist.nproc_per_node=2",
                      "+bench.job=0,1,2,3", *BATCH, f"hydra.sweep.dir={work / 'sweep'}"], work, out, repo=repo)

    try:
        job(base), job(REPO)  # warm the file cache
        ratios: Dict[str, List[float]] = {"PF2 2-rank job: all ranks in train()": [],
                                          "PF2 2-rank job: command wall time": [], "PF3 4-job sweep, sequential": []}
        for index in range(rounds):
            first, second = (base, REPO) if index % 2 == 0 else (REPO, base)
            timings = {first: job(first), second: job(second)}
            ratios["PF2 2-rank job: all ranks in train()"].append(timings[REPO][0] / timings[base][0])
            ratios["PF2 2-rank job: command wall time"].append(timings[REPO][1] / timings[base][1])
            sweeps = {first: sweep(first), second: sweep(second)}
            ratios["PF3 4-job sweep, sequential"].append(sweeps[REPO][1] / sweeps[base][1])
        print(f"launch regression: this tree / {baseline}, {rounds} interleaved rounds, {os.cpu_count()} CPUs")
        for name, values in ratios.items():
            ordered = sorted(values)
            p10, p90 = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(round(0.9 * (len(ordered) - 1)))]
            print(f"{name:<40} median {statistics.median(values):.3f}x  (p10 {p10:.3f}x, p90 {p90:.3f}x)")
        print("goal: each median <= 1.05x")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", help="compare this tree against this git revision (PF2, PF3)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds with --baseline")
    args = parser.parse_args()
    if args.baseline:
        paired(args.rounds, args.baseline)
        return

    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-"))
    out = work / "entries"
    out.mkdir()
    (work / "train.py").write_text(DSCONF_SCRIPT)
    (work / "plain.py").write_text(PLAIN_SCRIPT)
    (work / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    python = sys.executable
    torchrun = shutil.which("torchrun", path=os.path.dirname(python)) or "torchrun"
    torchrun_job = [torchrun, "--standalone", "--nproc_per_node", "2", "plain.py", "--deepspeed_config",
                    "ds_config.json"]

    from dsconf.schema.dist import DistConfig

    default_method = DistConfig().start_method
    variants = [("dsconf", [])] + ([("dsconf start_method=auto", ["dist.start_method=auto"])]
                                   if default_method != "auto" else [])
    print(f"torch elastic launch benchmark: {os.cpu_count()} CPUs, median of {args.repeat}, "
          f"dsconf default dist.start_method={default_method}\n")

    def dsconf_run(extra: List[str]) -> tuple[float, float]:
        return timed([python, "train.py", "dist.nproc_per_node=2", "+bench.job=0", *BATCH, *extra,
                      f"hydra.run.dir={work / 'run'}"], work, out)

    def dsconf_sweep(extra: List[str], parallel: int) -> tuple[float, float]:
        return timed([python, "train.py", "-m", "hydra/launcher=dsconf", f"hydra.launcher.max_parallel_jobs={parallel}",
                      "dist.nproc_per_node=2", "+bench.job=0,1,2,3", *BATCH, *extra,
                      f"hydra.sweep.dir={work / 'sweep'}"], work, out)

    loop = " ; ".join(" ".join(torchrun_job + ["--job", str(i)]) for i in range(4))
    rows = []
    base_a = median_of(args.repeat, lambda: timed(torchrun_job, work, out))
    base_b = median_of(args.repeat, lambda: timed([f"set -e; {loop}"], work, out, shell=True))
    rows.append(("(a) 2-rank job: all ranks in train()", "torchrun --standalone", base_a[0], base_a[0]))
    for name, extra in variants:
        a = median_of(args.repeat, lambda extra=extra: dsconf_run(extra))
        rows.append(("(a) 2-rank job: all ranks in train()", name, a[0], base_a[0]))
        rows.append(("(a') 2-rank job: command wall time", name, a[1], base_a[1]))
    rows.insert(1, ("(a') 2-rank job: command wall time", "torchrun --standalone", base_a[1], base_a[1]))
    rows.append(("(b) 4-job sweep, sequential", "4 x torchrun (shell loop)", base_b[1], base_b[1]))
    for name, extra in variants:
        b = median_of(args.repeat, lambda extra=extra: dsconf_sweep(extra, 1))
        rows.append(("(b) 4-job sweep, sequential", name, b[1], base_b[1]))
    for name, extra in variants:
        c = median_of(args.repeat, lambda extra=extra: dsconf_sweep(extra, 2))
        rows.append(("(c) 4-job sweep, 2 jobs in parallel", name, c[1], base_b[1]))

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'launcher':<28} {'seconds':>8}  {'vs torchrun':>11}")
    for measure, name, seconds, base in rows:
        print(f"{measure:<{width}}  {name:<28} {seconds:8.2f}  {seconds / base:10.2f}x")
    print(textwrap.dedent("""
        goals: (a), (b) <= 1.0x; (c) < 0.6x"""))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
