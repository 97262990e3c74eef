"""HF Transformers' Trainer on dsconf's config, through dsconf's launcher, on CPU (bf16, gloo): ZeRO-2 and ZeRO-3 at
1 and 2 ranks. The loss falls, and the config of the DeepSpeed engine the Trainer built equals ``ds_config.json``
(whose HF "auto" values dsconf filled before any rank started), but for the one key Accelerate always overwrites.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from optional_packages import requires
from test_train import EXAMPLES, ok, output, read_json, run_example

pytestmark = requires("transformers", "the hf extra is not installed")

CHECK_APP = """
import json, os, sys
sys.path.insert(0, {examples!r})
from hf_trainer import build_trainer  # the example's own Trainer
import dsconf
from dsconf.launch import context

@dsconf.main(config_path={conf!r}, config_name="hf_trainer", version_base=None)
def main(cfg):
    trainer = build_trainer(cfg)
    trainer.train()
    if context.rank() == 0:
        engine = trainer.model_wrapped
        with open(os.path.join(context.job_dir(), "engine.json"), "w") as fh:
            json.dump({{"type": type(engine).__name__, "config": engine.config,
                       "world_size": engine.world_size,
                       "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log]}}, fh)

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("zero", ["stage2", "stage3"])
def test_trainer_runs_the_dict_dsconf_filled(zero, ranks, tmp_path):
    app = tmp_path / "check_app.py"
    app.write_text(textwrap.dedent(CHECK_APP.format(examples=str(EXAMPLES), conf=str(EXAMPLES / "conf"))))
    run_dir = tmp_path / "run"
    ok(run_example(f"zero={zero}", f"dist.nproc_per_node={ranks}", f"hydra.run.dir={run_dir}", cwd=tmp_path,
                   script=app, timeout=600))
    ds_config = read_json(run_dir / "ds_config.json")
    engine = json.loads((run_dir / "engine.json").read_text())
    assert engine["type"] == "DeepSpeedEngine" and engine["world_size"] == ranks
    assert engine["config"].pop("steps_per_print") == float("inf")  # Accelerate turns DeepSpeed's step log off
    ds_config.pop("steps_per_print", None)
    assert engine["config"] == ds_config
    assert '"auto"' not in json.dumps(ds_config)  # every HF "auto" value was filled before launch
    assert ds_config["zero_optimization"]["stage"] == int(zero[-1]) and ds_config["bf16"]["enabled"] is True
    assert ds_config["train_batch_size"] == 8 * ranks  # per_device_train_batch_size x world size
    assert ds_config["zero_optimization"]["reduce_bucket_size"] == 64 * 64  # the model config's hidden size
    assert ds_config["scheduler"]["params"]["total_num_steps"] == 40
    losses = engine["losses"]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0], losses


@pytest.mark.slow
def test_the_example_trains_and_prints_its_loss(tmp_path):
    proc = ok(run_example(f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, script=EXAMPLES / "hf_trainer.py",
                          timeout=600))
    found = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+), [\d,]+ samples/s", proc.stdout)
    assert found, output(proc)
    assert float(found.group(2)) < float(found.group(1))


@pytest.mark.slow  # imports transformers
def test_a_value_that_disagrees_with_training_args_stops_before_any_rank(tmp_path):
    proc = run_example("deepspeed.optimizer.params.lr=0.01", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                       script=EXAMPLES / "hf_trainer.py")
    assert proc.returncode == 2, output(proc)
    assert proc.stderr.startswith("dsconf: ") and "Traceback" not in output(proc)
    assert "deepspeed.optimizer.params.lr: is 0.01 but training_args.learning_rate is 0.003" in proc.stderr
    assert not (tmp_path / "run" / "ds_config.json").exists()


def test_a_sweep_is_checked_with_the_trainers_output_dir_resolved_as_in_its_jobs(tmp_path):
    """The sweep check composes every job in the launching process, where ``${hydra:runtime.output_dir}`` (the
    Trainer's output_dir) must resolve as in the job: a mistake is then reported for each job, nothing runs."""
    proc = run_example("-m", "zero=stage2,stage3", "deepspeed.optimizer.params.lr=0.01",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, script=EXAMPLES / "hf_trainer.py")
    assert proc.returncode == 2, output(proc)
    assert "Traceback" not in output(proc) and "HydraConfig was not set" not in output(proc)
    assert proc.stderr.count("is 0.01 but training_args.learning_rate is 0.003") == 2, proc.stderr
    assert not (tmp_path / "sweep" / "0").exists()


@pytest.mark.slow
@pytest.mark.parametrize("examples, gas, drop_last", [(512, 3, False), (500, 2, True), (200, 1, False)])
def test_total_steps_from_train_examples_are_the_trainers(examples, gas, drop_last, tmp_path):
    # max_steps unset: the Trainer computes its steps from the dataloader it builds, then checks the dict's
    # scheduler.params.total_num_steps against them (HF's mismatch error): the run passing is the proof
    run_dir = tmp_path / "run"
    ok(run_example("dist.nproc_per_node=2", "training_args.max_steps=-1", "+training_args.num_train_epochs=1",
                   f"training_args.gradient_accumulation_steps={gas}",
                   f"+training_args.dataloader_drop_last={drop_last}",
                   f"data.examples={examples}", f"+hf.train_examples={examples}", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path, script=EXAMPLES / "hf_trainer.py", timeout=600))
    params = read_json(run_dir / "ds_config.json")["scheduler"]["params"]
    batches = examples // 8 if drop_last else -(-examples // 8)
    per_rank = batches // 2 if drop_last else -(-batches // 2)
    assert params["total_num_steps"] == -(-per_rank // gas)
