"""Config groups: every option composes and lands in the node it configures; groups are selectable without
`+` from a user's script and YAML; YAML composition gives the same result as the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dsconf
from dsconf.groups import group_options

BATCH = "deepspeed.train_micro_batch_size_per_gpu=2"
CONF = Path(__file__).resolve().parents[1] / "conf"
REQUIRED = {"warmup_decay": ["deepspeed.scheduler.params.total_num_steps=10"],
            "warmup_cosine": ["deepspeed.scheduler.params.total_num_steps=10"],
            "one_cycle": ["deepspeed.scheduler.params.cycle_min_lr=0.1", "deepspeed.scheduler.params.cycle_max_lr=1"],
            "torch": ["deepspeed.optimizer.type=RMSprop"]}
TARGET = {"amp": "0.19.5", "onebitadam": "0.19.5", "onebitlamb": "0.19.5", "zerooneadam": "0.19.5"}


def test_groups_are_the_documented_ones():
    groups = group_options()
    assert groups["precision"] == ["fp32", "fp16", "bf16", "amp", "torch_autocast"]
    assert {"stage0", "stage1", "stage2", "stage3", "stage2_offload", "stage3_offload"} <= set(groups["zero"])
    assert {"adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "lion", "adagrad", "sgd"} <= set(
        groups["optimizer"])
    assert groups["scheduler"] == ["none", "warmup", "warmup_decay", "warmup_cosine", "one_cycle", "lr_range_test"]
    assert groups["sparse_attention"] == ["none", "dense", "fixed", "variable", "bigbird", "bslongformer"]
    assert groups["activation_checkpointing"][0] == "none" and len(groups["activation_checkpointing"]) > 2


@pytest.mark.parametrize("group, option", [(g, o) for g, options in group_options().items() for o in options])
def test_every_option_composes(group, option):
    target = TARGET.get(option, "0.19.5" if group == "sparse_attention" and option != "none" else None)
    ds = dsconf.compose([f"{group}={option}", BATCH, *REQUIRED.get(option, [])], world_size=1,
                        deepspeed_version=target)
    if group == "zero":
        assert ds["zero_optimization"]["stage"] == int(option[5])
        assert ("offload_optimizer" in ds["zero_optimization"]) == ("offload" in option)
    elif group == "precision" and option != "fp32":
        section = {"fp16": "fp16", "bf16": "bf16", "amp": "amp", "torch_autocast": "torch_autocast"}[option]
        assert ds[section]["enabled"] is True
    elif group in ("optimizer", "scheduler", "sparse_attention", "activation_checkpointing"):
        assert (group in ds) == (option != "none")
        if group == "sparse_attention" and option != "none":
            assert ds["sparse_attention"]["mode"] == option


def test_yaml_composition_equals_command_line():
    from_yaml = dsconf.compose(["+experiment=zero2_bf16_warmup"], config_dir=str(CONF), config_name="config",
                               world_size=2)
    from_cli = dsconf.compose(["zero=stage2", "precision=bf16", "optimizer=adamw", "scheduler=warmup",
                               "deepspeed.train_micro_batch_size_per_gpu=8", "deepspeed.steps_per_print=10",
                               "deepspeed.train_batch_size=64", "deepspeed.optimizer.params.lr=3e-4",
                               "deepspeed.optimizer.params.weight_decay=0.01",
                               "deepspeed.scheduler.params.warmup_max_lr=3e-4",
                               "deepspeed.scheduler.params.warmup_num_steps=100",
                               "deepspeed.zero_optimization.overlap_comm=true"], world_size=2)
    assert from_yaml == from_cli
    assert from_yaml["gradient_accumulation_steps"] == 4


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_shipped_experiments_compose(experiment):
    import warnings

    from dsconf.validation import LegacyKeyWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = dsconf.compose([f"+experiment={experiment}"], config_dir=str(CONF), config_name="config", world_size=2)
    legacy = [w for w in caught if issubclass(w.category, LegacyKeyWarning)]
    assert len(legacy) == (3 if experiment == "legacy_seed" else 0)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2


def test_hydra_main_user_script_selects_groups_without_plus(tmp_path):
    """A user's own @hydra.main script with `defaults: [dsconf, _self_]`, run from another directory."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text(textwrap.dedent("""
        defaults:
          - dsconf
          - _self_
        model: {hidden: 32}
        deepspeed:
          train_micro_batch_size_per_gpu: 4
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import json, hydra, dsconf
        @hydra.main(config_path="conf", config_name="train", version_base=None)
        def main(cfg):
            print("DS=" + json.dumps(dsconf.to_deepspeed(cfg)))
        main()
    """))
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    proc = subprocess.run([sys.executable, str(tmp_path / "train.py"), "zero=stage3", "precision=bf16",
                           "scheduler=warmup", "deepspeed.zero_optimization.overlap_comm=false",
                           "dist.nproc_per_node=2", "hydra.run.dir=."], cwd=run_dir, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ds = json.loads(proc.stdout.split("DS=", 1)[1].splitlines()[0])
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["overlap_comm"] is False
    assert ds["bf16"]["enabled"] and ds["scheduler"]["type"] == "WarmupLR"
    assert ds["train_batch_size"] == 8  # micro 4 x 2 ranks from dist


def test_primary_config_named_dsconf_without_a_config_dir(tmp_path):
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import hydra, dsconf
        @hydra.main(config_path=None, config_name="dsconf", version_base=None)
        def main(cfg):
            print("STAGE", cfg.deepspeed.zero_optimization.stage, "TB", cfg.deepspeed.train_batch_size)
        main()
    """))
    proc = subprocess.run([sys.executable, str(tmp_path / "app.py"), "zero=stage1",
                           "deepspeed.train_micro_batch_size_per_gpu=3", "hydra.run.dir=."], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "STAGE 1 TB 3" in proc.stdout
