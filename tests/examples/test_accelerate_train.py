"""Accelerate on dsconf's config, through dsconf's launcher (no ``accelerate launch``), on CPU: ZeRO-2 in bf16 at 1 and
2 ranks. The loss falls, and the engine Accelerate built runs ``ds_config.json``, but for the one key Accelerate
always overwrites; its precision and accumulation agree with the dict.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from optional_packages import requires
from test_train import EXAMPLES, ok, output, read_json, run_example

pytestmark = requires("accelerate", "the hf extra is not installed")

CHECK_APP = """
import json, os, sys
sys.path.insert(0, {examples!r})
from accelerate_train import train  # the example's own loop
import dsconf
from dsconf.launch import context

@dsconf.main(config_path={conf!r}, config_name="accelerate_train", version_base=None)
def main(cfg):
    acc, engine, losses = train(cfg)
    if context.rank() == 0:
        with open(os.path.join(context.job_dir(), "engine.json"), "w") as fh:
            json.dump({{"type": type(engine).__name__, "config": engine.config, "world_size": engine.world_size,
                       "num_processes": acc.num_processes, "mixed_precision": acc.mixed_precision,
                       "accumulation": acc.gradient_accumulation_steps, "losses": losses}}, fh)

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_accelerate_runs_the_dict_dsconf_exported(ranks, tmp_path):
    app = tmp_path / "check_app.py"
    app.write_text(textwrap.dedent(CHECK_APP.format(examples=str(EXAMPLES), conf=str(EXAMPLES / "conf"))))
    run_dir = tmp_path / "run"
    ok(run_example(f"dist.nproc_per_node={ranks}", "deepspeed.gradient_accumulation_steps=2",
                   f"hydra.run.dir={run_dir}", cwd=tmp_path, script=app, timeout=600))
    ds_config = read_json(run_dir / "ds_config.json")
    engine = json.loads((run_dir / "engine.json").read_text())
    assert engine["type"] == "DeepSpeedEngine" and engine["world_size"] == engine["num_processes"] == ranks
    assert engine["config"].pop("steps_per_print") == float("inf")  # Accelerate turns DeepSpeed's step log off
    ds_config.pop("steps_per_print", None)
    assert engine["config"] == ds_config
    assert ds_config["zero_optimization"]["stage"] == 2 and ds_config["train_batch_size"] == 8 * 2 * ranks
    assert engine["mixed_precision"] == "bf16" and engine["accumulation"] == 2
    losses = engine["losses"]
    assert len(losses) == 30 and sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


@pytest.mark.slow
def test_the_example_trains_and_prints_its_loss(tmp_path):
    proc = ok(run_example(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, script=EXAMPLES / "accelerate_train.py",
                          timeout=600))
    found = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+) in 30 steps on 1 rank", proc.stdout)
    assert found and float(found.group(2)) < float(found.group(1)), output(proc)
