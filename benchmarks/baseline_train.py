"""The example's training, started the hand-written way: torchrun and a DeepSpeed JSON file, no dsconf, no Hydra.

    torchrun --standalone --nproc_per_node 2 benchmarks/baseline_train.py --ds-config ds_config.json \\
        --steps 60 --out runs/baseline

The baseline ``benchmarks/bench_train.py`` compares ``python examples/train.py`` with: same model, same training
loop (``examples/training.py``), same DeepSpeed dict (the ``ds_config.json`` dsconf saved for that run).
Rank 0 writes ``metrics.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from training import ModelConfig, TrainConfig, train  # noqa: E402  (examples/training.py: no dsconf in it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ds-config", required=True, help="DeepSpeed JSON config, for this run's world size")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--model", default="{}", help='ModelConfig fields as JSON, e.g. \'{"hidden": 128}\'')
    parser.add_argument("--out", default=".", help="where rank 0 writes metrics.json")
    args = parser.parse_args()

    with open(args.ds_config, encoding="utf-8") as fh:
        ds_config = json.load(fh)
    os.makedirs(args.out, exist_ok=True)
    train(ds_config, ModelConfig(**json.loads(args.model)), TrainConfig(steps=args.steps, seed=args.seed),
          out_dir=args.out)


if __name__ == "__main__":
    main()
