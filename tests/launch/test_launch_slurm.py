"""dsconf on SLURM: one task per rank, torch's variables from SLURM's alone (``dsconf.launch.environments.slurm``).

No cluster here: the tests start the tasks themselves with exactly the variables ``srun`` gives each task
(2 nodes x 4 tasks; both "nodes" are this host under two names), on a simulated GPU host
(``gpu_sim/fake_cuda.py``) in each of SLURM's GPU binding modes, with and without the variable submitit's sbatch
script adds, and with MASTER_ADDR/MASTER_PORT exported by the batch script. Each task binds
``set_device(LOCAL_RANK)`` as DeepSpeed does. The last test runs the real chain, Hydra's submitit launcher with
its local executor (``tasks_per_node=2``).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import rank_facts
from test_launch_gpu_host import SIM_SCRIPT, fake_cuda, sim_env

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=3"]
TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def slurm_task_env(*, job_id: int, procid: int, ntasks: int, nodes: list[str], tasks_per_node: int) -> dict:
    node_id = procid // tasks_per_node
    nodelist = ",".join(nodes)
    env = {k: v for k, v in os.environ.items() if k not in TORCH_VARS and not k.startswith("SLURM_")}
    env.update({
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % tasks_per_node), "SLURM_NODEID": str(node_id),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURMD_NODENAME": nodes[node_id], "SLURM_TOPOLOGY_ADDR": nodes[node_id],
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})", "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
        "SLURM_CPUS_ON_NODE": str(os.cpu_count() or 1), "SLURM_SUBMIT_DIR": os.getcwd(),
        "SLURM_SUBMIT_HOST": nodes[0], "SLURM_CLUSTER_NAME": "test", "SLURM_JOB_PARTITION": "cpu",
        "SUBMITIT_EXECUTOR": "slurm",  # exported by the sbatch script submitit writes
    })
    return env


def two_node_names() -> list[str]:
    host = socket.gethostname()
    return [host, "localhost"] if host != "localhost" else ["localhost", "127.0.0.1"]


# (SLURM_GPUS_PER_TASK, GPUs on each simulated node, CUDA_VISIBLE_DEVICES of a local task): SLURM's binding modes
BINDINGS = {
    "unbound": (None, 4, lambda local: None),  # every task sees all of its node's GPUs
    "physical-ids": (None, 8, lambda local: "4,5,6,7"),  # the job's allocation, by physical id, shared by its tasks
    "gpus-per-task": ("1", 8, lambda local: str(4 + local)),  # srun --gpus-per-task=1: one device of its own per task
}


@pytest.mark.parametrize("binding,submitit,batch_master", [
    ("unbound", False, False), ("physical-ids", False, True), ("gpus-per-task", False, False),
    ("gpus-per-task", True, False)], ids=["unbound", "physical-ids+sbatch-master", "gpus-per-task",
                                          "gpus-per-task+submitit"])
@pytest.mark.slow  # starts ranks
def test_two_nodes_of_four_tasks_each_rank_on_its_own_gpu(tmp_path: Path, binding: str, submitit: bool,
                                                           batch_master: bool) -> None:
    """Findings 1 and 2: plain srun (or submitit's sbatch), several tasks per node, every binding mode."""
    gpus_per_task, node_gpus, visible = BINDINGS[binding]
    nodes, tasks_per_node = two_node_names(), 4
    script, out, run_dir, log = tmp_path / "train.py", tmp_path / "facts", tmp_path / "run", tmp_path / "sim.jsonl"
    script.write_text(SIM_SCRIPT)
    out.mkdir()
    job_id = random.randint(100000, 999999)
    port = random.randint(30000, 40000)
    tasks = []
    for procid in range(8):
        env = slurm_task_env(job_id=job_id, procid=procid, ntasks=8, nodes=nodes, tasks_per_node=tasks_per_node)
        if not submitit:
            env.pop("SUBMITIT_EXECUTOR")
        if batch_master:  # the usual sbatch recipe exports these for every task
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if gpus_per_task:
            env["SLURM_GPUS_PER_TASK"] = gpus_per_task
        local = procid % tasks_per_node
        env.update({k: v for k, v in sim_env(node_gpus, log).items() if k in ("DSCONF_SIM_GPUS", "DSCONF_SIM_LOG",
                                                                               "PYTHONPATH")})
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible(local) is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible(local)
        tasks.append(subprocess.Popen([sys.executable, str(script), *BATCH, f"+test.out={out}",
                                       f"hydra.run.dir={run_dir}"], cwd=str(tmp_path), text=True, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for task in tasks:
        _, stderr = task.communicate(timeout=300)
        assert task.returncode == 0, stderr[-3000:]
    facts = rank_facts(out)
    assert [f["rank"] for f in facts] == list(range(8))  # RANK is SLURM_PROCID
    assert {f["WORLD_SIZE"] for f in facts} == {"8"} and {f["allreduce"] for f in facts} == {36}
    assert {f["LOCAL_WORLD_SIZE"] for f in facts} == {"4"}
    assert {f["MASTER_ADDR"] for f in facts} == {"127.0.0.1" if batch_master else nodes[0]}
    if batch_master:
        assert {f["MASTER_PORT"] for f in facts} == {str(port)}
    binds = {int(e["RANK"]): e for e in fake_cuda.events(str(log)) if e["kind"] == "set_device"}
    assert sorted(binds) == list(range(8)) and all(e.get("error") is None for e in binds.values())
    allocation = {"unbound": {0, 1, 2, 3}, "physical-ids": {4, 5, 6, 7}, "gpus-per-task": {4, 5, 6, 7}}[binding]
    for node in (0, 1):
        physical = [binds[r]["physical"] for r in range(node * 4, node * 4 + 4)]
        assert len(set(physical)) == 4 and set(physical) <= allocation, physical  # distinct GPUs in the allocation
    saved = json.loads((run_dir / "ds_config.json").read_text())  # written by rank 0, for the world of 8
    assert saved["train_batch_size"] == 2 * 3 * 8
    assert [f["ds"] for f in facts] == [saved] * 8
    assert not (run_dir / "logs").exists()  # ran in place: dsconf started no ranks of its own


@pytest.mark.skipif(not __import__("importlib").util.find_spec("hydra_plugins.hydra_submitit_launcher"),
                    reason="hydra-submitit-launcher is not installed (pip install dsconf[slurm])")
@pytest.mark.slow  # starts ranks
def test_hydra_submitit_launcher_runs_each_task_as_a_rank(train_script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, str(train_script), "-m", "hydra/launcher=submitit_local",
                           "hydra.launcher.tasks_per_node=2", "hydra.launcher.timeout_min=5", *BATCH,
                           "+test.which=a,b", f"hydra.sweep.dir={sweep_dir}"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for job in ("0", "1"):
        facts = rank_facts(sweep_dir / job)
        assert [f["rank"] for f in facts] == [0, 1] and {f["WORLD_SIZE"] for f in facts} == {"2"}
        assert {f["allreduce"] for f in facts} == {3}
        assert json.loads((sweep_dir / job / "ds_config.json").read_text())["train_batch_size"] == 2 * 3 * 2
