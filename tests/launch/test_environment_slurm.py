"""torch's variables from SLURM's (and submitit-local's), without submitit, as ``srun`` sets them per task."""

from __future__ import annotations

from typing import Optional

import pytest

from dsconf.launch.environments import Rank, detect, export_rank


def scheduler_rank(env: dict, gpus: Optional[int] = None) -> Rank:
    found = detect(env, gpus=gpus)
    assert found is not None and found.rank is not None
    return found.rank


def export_scheduler_env(env: dict) -> Rank:
    found = detect(env)
    assert found is not None and found.name == "slurm"
    export_rank(found, env)
    return found.rank


def srun_env(procid: int, *, nodes: str = "gpu[07-08]", per_node: str = "4(x2)", ntasks: int = 8, **extra: str) -> dict:
    return {"SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid % 4), "SLURM_NODEID": str(procid // 4),
            "SLURM_NTASKS": str(ntasks), "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": nodes,
            "SLURM_STEP_NODELIST": nodes, "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_TASKS_PER_NODE": per_node,
            **extra}


def test_plain_srun_variables_make_a_torch_world() -> None:
    """Finding 2: no SUBMITIT_EXECUTOR, as with `srun python train.py`."""
    ranks = [scheduler_rank(srun_env(i), gpus=0) for i in range(8)]
    assert [r.rank for r in ranks] == list(range(8)) and {r.world_size for r in ranks} == {8}
    assert [r.local_rank for r in ranks] == [0, 1, 2, 3] * 2 and [r.node_rank for r in ranks] == [0] * 4 + [1] * 4
    assert {r.master_addr for r in ranks} == {"gpu07"}  # the step's first node, from SLURM's compressed list
    assert len({r.master_port for r in ranks}) == 1 and 20000 <= ranks[0].master_port <= 60000
    other_job = scheduler_rank({**srun_env(0), "SLURM_JOB_ID": "4243"}, gpus=0)
    assert other_job.master_port != ranks[0].master_port


def test_batch_script_master_addr_and_port_are_kept() -> None:
    """Finding 2: an sbatch script exporting MASTER_ADDR/MASTER_PORT used to fail ('already set')."""
    env = srun_env(5, MASTER_ADDR="10.0.0.7", MASTER_PORT="29500")
    task = export_scheduler_env(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29500")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("5", "8", "4", "1")
    assert task.master_addr == "10.0.0.7"


@pytest.mark.parametrize("nodes,per_node,node,expected_master,expected_local_world", [
    ("a[1-2],b7", "3,2(x2)", 2, "a1", 2), ("node-[001-004]", "1(x4)", 3, "node-001", 1)])
def test_uneven_tasks_per_node_and_node_lists(nodes, per_node, node, expected_master, expected_local_world) -> None:
    env = {**srun_env(0, nodes=nodes, per_node=per_node, ntasks=7), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0"}
    task = scheduler_rank(env, gpus=0)
    assert (task.master_addr, task.local_world_size) == (expected_master, expected_local_world)


@pytest.mark.parametrize("extra,gpus,expected", [
    ({}, 4, [0, 1, 2, 3]),  # unbound: local rank i uses visible device i
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None, [0, 1, 2, 3]),  # the allocation's physical ids, shared
    ({"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "6"}, None, [0, 0, 0, 0]),  # bound: the task's own
    ({"CUDA_VISIBLE_DEVICES": "0"}, None, [0, 0, 0, 0]),  # bound without SLURM_GPUS_PER_TASK (--gpu-bind)
    ({}, 0, [0, 1, 2, 3]),  # CPU tasks
])
def test_local_rank_indexes_a_device_the_task_sees(extra, gpus, expected) -> None:
    """Finding 1: submitit set CUDA_VISIBLE_DEVICES=str(local_rank) and kept LOCAL_RANK: ordinal >= 1 was invalid."""
    assert [scheduler_rank(srun_env(i, **extra), gpus=gpus).local_rank for i in range(4)] == expected


def test_submitit_local_executor() -> None:
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1",
           "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_ID": "99"}
    task = scheduler_rank(env, gpus=0)
    assert (task.rank, task.local_rank, task.world_size, task.master_addr) == (1, 1, 2, "localhost")


@pytest.mark.parametrize("variable, value", [("SLURM_NTASKS", "eight"), ("SLURM_NODEID", "x"),
                                             ("MASTER_PORT", "port"), ("SUBMITIT_LOCAL_NTASKS", "two")])
def test_a_malformed_scheduler_variable_is_one_line_naming_it(variable: str, value: str) -> None:
    from dsconf.errors import ConfigError

    env = ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "0"} if variable.startswith("SUBMITIT")
           else srun_env(0))
    with pytest.raises(ConfigError) as err:
        detect({**env, variable: value}, gpus=0)
    assert err.value.paths == [variable] and "is not a number" in str(err.value), str(err.value)
