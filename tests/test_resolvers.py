"""The ${dsconf.batch:} resolver: batch keys read from the composed config are the derived triple for the
job's data-parallel size, from `dist` before launch and from the environment inside a running job."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dsconf.composition import compose_config
from dsconf.export import to_deepspeed
from dsconf.resolvers import complete_batch

DIST_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID")


@pytest.fixture(autouse=True)
def no_distributed_env(monkeypatch):
    for var in DIST_ENV:
        monkeypatch.delenv(var, raising=False)


def triple(cfg):
    ds = cfg.deepspeed
    return ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps


def test_world_size_from_dist_before_launch():
    cfg = compose_config(["deepspeed.train_micro_batch_size_per_gpu=8", "deepspeed.gradient_accumulation_steps=2",
                          "dist.nproc_per_node=4", "dist.nnodes=2"])
    assert triple(cfg) == (128, 8, 2)


def test_model_parallel_sizes_divide_the_world():
    cfg = compose_config(["deepspeed.train_batch_size=64", "deepspeed.train_micro_batch_size_per_gpu=8",
                          "dist.nproc_per_node=8", "dist.tensor_parallel_size=2", "dist.pipeline_parallel_size=2"])
    assert triple(cfg) == (64, 8, 4)  # data-parallel size 8 / (2 x 2) = 2


def test_world_size_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = compose_config(["deepspeed.train_batch_size=32", "dist.nproc_per_node=4"])
    assert triple(cfg) == (32, 16, 1)


def test_world_size_from_slurm_environment(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "3")
    cfg = compose_config(["deepspeed.train_batch_size=32", "deepspeed.gradient_accumulation_steps=2"])
    assert triple(cfg) == (32, 4, 2)


def test_auto_means_derive():
    cfg = compose_config(["deepspeed.train_batch_size=auto", "deepspeed.train_micro_batch_size_per_gpu=4",
                          "deepspeed.gradient_accumulation_steps=auto", "dist.nproc_per_node=2"])
    assert to_deepspeed(cfg)["train_batch_size"] == 8
    complete_batch(cfg)
    assert triple(cfg) == (8, 4, 1)


def test_resolved_values_equal_the_export():
    cfg = compose_config(["deepspeed.train_batch_size=48", "deepspeed.gradient_accumulation_steps=3",
                          "dist.nproc_per_node=2"])
    exported = to_deepspeed(cfg)
    assert triple(cfg) == (exported["train_batch_size"], exported["train_micro_batch_size_per_gpu"],
                           exported["gradient_accumulation_steps"]) == (48, 8, 3)


def test_impossible_triple_fails_on_read_with_the_keys_named():
    cfg = compose_config(["deepspeed.train_batch_size=33", "dist.nproc_per_node=2"])
    with pytest.raises(Exception, match="deepspeed.train_batch_size") as info:
        OmegaConf.to_container(cfg.deepspeed, resolve=True)
    assert "32 or 34" in str(info.value)


def test_deepspeeds_sequence_parallel_size_divides_the_world_as_in_deepspeed(deepspeed_parse):
    """One fact: deepspeed.sequence_parallel_size, read by dsconf's triple and by DeepSpeed's parser alike."""
    import dsconf

    overrides = ["deepspeed.train_micro_batch_size_per_gpu=4", "deepspeed.gradient_accumulation_steps=2",
                 "deepspeed.sequence_parallel_size=2"]
    cfg = compose_config([*overrides, "dist.nproc_per_node=4"])
    assert triple(cfg) == (16, 4, 2)  # data-parallel size 4 / 2 = 2
    exported = dsconf.compose(overrides, world_size=4)
    assert exported["sequence_parallel_size"] == 2 and exported["train_batch_size"] == 16
    result = deepspeed_parse(exported, 4)
    assert result["ok"], result["error"]
    assert result["triple"] == [16, 4, 2]
    # and DeepSpeed's own derivation from the minimal input agrees
    minimal = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "sequence_parallel_size": 2}
    assert deepspeed_parse(minimal, 4)["triple"] == [16, 4, 2]
