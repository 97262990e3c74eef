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

from paired import REPO, baseline_tree, interleaved, spread, tree_env

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
    env = tree_env(repo, BENCH_OUT=str(out))
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
    with baseline_tree(baseline, "dsconf-bench-") as (work, base):
        out = work / "entries"
        out.mkdir()
        (work / "train.py").write_text(DSCONF_SCRIPT)
        python = sys.executable

        def job(repo: Path) -> tuple[float, float]:
            return timed([python, "train.py", "dist.nproc_per_node=2", "+bench.job=0", *BATCH,
                          f"hydra.run.dir={work / 'run'}"], work, out, repo=repo)

        def sweep(repo: Path) -> tuple[float, float]:
            return timed([python, "train.py", "-m", "hydra/launcher=dsconf", "dist.nproc_per_node=2",
                          "+bench.job=0,1,2,3", *BATCH, f"hydra.sweep.dir={work / 'sweep'}"], work, out, repo=repo)

        # each round: a job from each tree, then a sweep from each, in the same order
        jobs: Dict[Path, List[tuple[float, float]]] = {base: [], REPO: []}

        def job_then_sweep(repo: Path) -> float:
            jobs[repo].append(job(repo))
            return sweep(repo)[1]

        sweep_ratios, _ = interleaved(rounds, base, job_then_sweep)
        ratios = {"PF2 2-rank job: all ranks in train()": [a[0] / b[0] for a, b in zip(jobs[REPO], jobs[base])],
                  "PF2 2-rank job: command wall time": [a[1] / b[1] for a, b in zip(jobs[REPO], jobs[base])],
                  "PF3 4-job sweep, sequential": sweep_ratios}
        print(f"launch regression: this tree / {baseline}, {rounds} interleaved rounds, {os.cpu_count()} CPUs")
        for name, values in ratios.items():
            print(f"{name:<40} {spread(values[-rounds:])}")
        print("goal: each median <= 1.03x (the launch layer may not slow a job down)")


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
