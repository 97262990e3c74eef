"""``dsconf validate`` of 100 real config files: this tree against a baseline revision, in the same run.

    python benchmarks/bench_validate.py --baseline REV [--rounds N]

The files are the corpus of public configs (tests/corpus/), repeated in order until there are 100, validated by one
``dsconf validate`` command (one process, as a user runs it over a folder). Each round runs the baseline and this
tree one after the other, alternating which goes first; the report is the median of the per-round ratios with their
p10-p90 spread. Goal: at most 1.05x.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from paired import REPO, baseline_tree, interleaved, spread, tree_env

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
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", *files], env=tree_env(repo),
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: some corpus files have problems, as they should
        raise RuntimeError(f"dsconf validate failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    with baseline_tree(args.baseline, "dsconf-bench-validate-") as (work, base):
        files = corpus_copy(work)
        ratios, ours = interleaved(args.rounds, base, lambda tree: timed(tree, files))
        print(f"dsconf validate, {FILES} files: this tree / {args.baseline}, {args.rounds} interleaved rounds")
        print(f"{spread(ratios)}; this tree {statistics.median(ours):.2f} s per command; goal <= 1.05x")


if __name__ == "__main__":
    main()
