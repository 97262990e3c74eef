"""``dsconf validate`` of 100 real config files: this tree against a baseline revision, in the same run.

    python benchmarks/bench_validate.py --baseline REV [--rounds N]

The files are the corpus of public configs (tests/corpus/), repeated in order until there are 100, validated by one
``dsconf validate`` command (one process, as a user runs it over a folder). Each round runs the baseline and this
tree one after the other, alternating which goes first; the report is the median of the per-round ratios with their
p10-p90 spread. Goal: at most 1.05x.
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
from typing import List

REPO = Path(__file__).resolve().parents[1]
FILES = 100


def corpus_copy(work: Path) -> List[str]:
    sources = sorted(p for p in (REPO / "tests" / "corpus").iterdir() if p.suffix in (".json", ".hjson", ".yaml"))
    out = []
    for index in range(FILES):
        source = sources[index % len(sources)]
        target = work / f"{index:03d}_{source.name}"
        shutil.copy(source, target)
        out.append(str(target))
    return out


def timed(repo: Path, files: List[str]) -> float:
    env = {**os.environ, "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(p for p in [str(repo), os.environ.get("PYTHONPATH")] if p)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", *files], env=env, capture_output=True,
                          text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: some corpus files have problems, as they should
        raise RuntimeError(f"dsconf validate failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsconf-bench-validate-"))
    base = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=REPO, check=True,
                   capture_output=True)
    try:
        files = corpus_copy(work)
        timed(base, files), timed(REPO, files)  # warm the file cache and bytecode
        ratios, ours = [], []
        for index in range(args.rounds):
            order = (base, REPO) if index % 2 == 0 else (REPO, base)
            seconds = {repo: timed(repo, files) for repo in order}
            ratios.append(seconds[REPO] / seconds[base])
            ours.append(seconds[REPO])
        ordered = sorted(ratios)
        p10, p90 = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(round(0.9 * (len(ordered) - 1)))]
        print(f"dsconf validate, {FILES} files: this tree / {args.baseline}, {args.rounds} interleaved rounds")
        print(f"median {statistics.median(ratios):.3f}x  (p10 {p10:.3f}x, p90 {p90:.3f}x); "
              f"this tree {statistics.median(ours):.2f} s per command; goal <= 1.05x")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
