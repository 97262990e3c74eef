"""World size: torchrun's nnodes/nproc_per_node syntax, the environment of a running job, parallel sizes."""

from __future__ import annotations

import pytest

from dsconf.errors import ConfigError
from dsconf.world import data_parallel_size, dist_world_size, env_world_size, parse_nnodes, resolve_nproc_per_node


def test_parse_nnodes():
    assert parse_nnodes("2") == (2, 2) and parse_nnodes(3) == (3, 3) and parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "4:2", "two", "1:x"):
        with pytest.raises(ConfigError, match="dist.nnodes"):
            parse_nnodes(bad)


def test_nproc_per_node(monkeypatch):
    assert resolve_nproc_per_node(3) == 3 and resolve_nproc_per_node("4") == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert resolve_nproc_per_node("auto") == 3 and resolve_nproc_per_node("gpu") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_nproc_per_node("auto") == 1
    for bad in (0, "many", True):
        with pytest.raises(ConfigError, match="dist.nproc_per_node"):
            resolve_nproc_per_node(bad)


def test_env_world_size():
    assert env_world_size({}) is None
    assert env_world_size({"WORLD_SIZE": "8"}) == 8
    assert env_world_size({"SLURM_NTASKS": "16", "SLURM_PROCID": "3"}) == 16
    assert env_world_size({"SLURM_NTASKS": "16"}) is None  # an allocation, not a task of a step


def test_data_parallel_size():
    dist = {"nproc_per_node": 4, "nnodes": "2", "tensor_parallel_size": 2, "pipeline_parallel_size": 1}
    assert dist_world_size(dist) == 8
    assert data_parallel_size(dist, environ={}) == 4
    assert data_parallel_size(dist, world_size=16) == 8
    assert data_parallel_size(dist, environ={"WORLD_SIZE": "4"}) == 2
    with pytest.raises(ConfigError, match="not divisible"):
        data_parallel_size({**dist, "tensor_parallel_size": 3}, environ={})
    # DeepSpeed's own sequence_parallel_size divides too
    assert data_parallel_size(dist, sequence_parallel_size=2, environ={}) == 2
    with pytest.raises(ConfigError, match="not divisible"):
        data_parallel_size(dist, sequence_parallel_size=3, environ={})


VISIBLE = ["0", "0,1", "0,1,-1,2", "2,0", "1gpu2,2ampere", " 3 , 1", "+3", "1,1", "0,x,1", "", "-1",
           "GPU-aa,GPU-bb", "GPU-aa,MIG-bb", "MIG-aa,MIG-aa", "MIG-1,MIG-2,3", "4,5,6,7"]


@pytest.mark.parametrize("text", VISIBLE)
def test_visible_devices_are_read_as_cuda_reads_them(text, monkeypatch):
    """torch's own parser (what CUDA does) is the reference; dsconf must not import torch to count."""
    import torch.cuda

    from dsconf.world import parse_visible_devices, visible_gpu_count

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", text)
    assert parse_visible_devices(text) == torch.cuda._parse_visible_devices()
    assert visible_gpu_count() == len(torch.cuda._parse_visible_devices())
