"""What ``dsconf schema`` costs: the command as users run it, against a goal of one second.

    python benchmarks/bench_json_schema.py [--rounds N]

Each round runs, one after the other (which goes first alternates), a fresh ``dsconf schema -o FILE`` (the installed
console script: interpreter start, imports, generation, writing) and a bare ``python -c pass`` (the interpreter's own
start). Reported: the median and 90th percentile wall time of the command, the bare start, their median paired
difference (what dsconf itself costs), and the generation alone in this process (warm imports).
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

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.0


def dsconf_script() -> str:
    script = Path(sys.executable).parent / "dsconf"
    found = str(script) if script.exists() else shutil.which("dsconf")
    if not found:
        sys.exit("the dsconf console script is not installed")
    return found


def wall(cmd: List[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    command = [dsconf_script(), "schema", "-o", "ds_config.schema.json"]
    bare = [sys.executable, "-c", "pass"]
    ours, base, extra = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        wall(command, tmp)  # warm the page cache
        for i in range(args.rounds):
            if i % 2:
                b, a = wall(bare, tmp), wall(command, tmp)
            else:
                a, b = wall(command, tmp), wall(bare, tmp)
            ours.append(a)
            base.append(b)
            extra.append(a - b)
        size = (Path(tmp) / "ds_config.schema.json").stat().st_size

    sys.path.insert(0, str(ROOT))
    from dsconf.json_schema import json_schema

    json_schema()  # imports and caches warm
    start = time.perf_counter()
    for _ in range(10):
        json_schema()
    generation = (time.perf_counter() - start) / 10

    median = statistics.median(ours)
    print(f"dsconf schema -o FILE ({size // 1024} KiB), {args.rounds} rounds:")
    print(f"  wall time           median {median * 1000:7.1f} ms   p90 {percentile(ours, 0.9) * 1000:7.1f} ms")
    print(f"  python -c pass      median {statistics.median(base) * 1000:7.1f} ms")
    print(f"  dsconf's own part   median {statistics.median(extra) * 1000:7.1f} ms (paired difference)")
    print(f"  generation alone    {generation * 1000:7.1f} ms (warm, in process)")
    print(f"  goal: under {GOAL_S:.0f} s -> {'met' if percentile(ours, 0.9) < GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
