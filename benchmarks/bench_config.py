"""Config path cost, measured in one run against baselines measured in the same run.

    python benchmarks/bench_config.py [--repeat N]

Reports (median of N):
- Hydra's floor: initialize + compose of a trivial structured config;
- Hydra composing dsconf's config alone (default, and a full config with every group chosen);
- dsconf compose + validate + export of the same (dsconf.compose);
- dsconf validate + export alone vs DeepSpeed's own DeepSpeedConfig parse of the same dict.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, List
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")

DEFAULT = ["deepspeed.train_micro_batch_size_per_gpu=8"]
FULL = ["precision=bf16", "zero=stage3_offload", "optimizer=adamw", "scheduler=warmup_cosine",
        "activation_checkpointing=partitioned", "sparse_attention=none", "deepspeed.train_batch_size=64",
        "deepspeed.gradient_accumulation_steps=2", "deepspeed.scheduler.params.total_num_steps=1000",
        "deepspeed.steps_per_print=10", "dist.nproc_per_node=4"]


@dataclass
class Trivial:
    lr: float = 0.1
    name: str = "x"


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm caches and imports
    times: List[float] = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=30)
    repeat = parser.parse_args().repeat

    from hydra import compose, initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    import dsconf
    from dsconf.composition import compose_config
    from dsconf.export import to_deepspeed

    ConfigStore.instance().store(name="bench_trivial", node=Trivial)

    def hydra_compose(name: str, overrides: List[str]) -> object:
        GlobalHydra.instance().clear()
        with initialize(version_base=None, config_path=None):
            return compose(config_name=name, overrides=overrides)

    import deepspeed.runtime.config as ds_config

    from dsconf.world import dist_world_size

    warnings.simplefilter("ignore")
    rows = []
    floor = median_ms(lambda: hydra_compose("bench_trivial", []), repeat)
    rows.append(("Hydra floor: trivial config", floor, None))
    for label, overrides in (("default", DEFAULT), ("full", FULL)):
        hydra_only = median_ms(lambda o=overrides: compose_config(o), repeat)
        full = median_ms(lambda o=overrides: dsconf.compose(o), repeat)
        cfg = compose_config(overrides)
        export = median_ms(lambda c=cfg: to_deepspeed(c), repeat * 5)
        exported = to_deepspeed(cfg)
        world = dist_world_size(cfg.dist)
        with mock.patch.object(ds_config.dist, "get_world_size", return_value=world), \
                mock.patch.object(ds_config.dist, "get_rank", return_value=0):
            ds_parse = median_ms(lambda d=exported: ds_config.DeepSpeedConfig(copy.deepcopy(d)), repeat * 5)
        rows += [
            (f"Hydra compose of dsconf's {label} config", hydra_only, floor),
            (f"dsconf compose+validate+export, {label}", full, floor),
            ("  ... vs Hydra composing the same config", full, hydra_only),
            (f"dsconf validate+export, {label}", export, None),
            (f"DeepSpeedConfig parse of the same dict, {label}", ds_parse, None),
            ("  dsconf validate+export / DeepSpeed parse", export, ds_parse),
        ]
    print(f"{'measurement':<52} {'ms':>9} {'ratio':>8}")
    for label, ms, base in rows:
        ratio = f"{ms / base:7.2f}x" if base else ""
        print(f"{label:<52} {ms:9.3f} {ratio:>8}")


if __name__ == "__main__":
    main()
