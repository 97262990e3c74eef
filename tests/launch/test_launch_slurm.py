"""dsconf on SLURM: one task per rank, torch's variables from SLURM's via submitit's TorchDistributedEnvironment.

No cluster here: the first test starts the tasks itself with exactly the variables ``srun`` gives each task of
an sbatch script written by submitit (2 nodes x 1 task; both "nodes" are this host under two names). The
second runs the real chain, Hydra's submitit launcher with its local executor (``tasks_per_node=2``).
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


def test_one_task_per_rank_forms_one_world_from_slurm_variables(train_script: Path, tmp_path: Path) -> None:
    host = socket.gethostname()
    nodes = [host, "localhost"] if host != "localhost" else ["localhost", "127.0.0.1"]
    out, run_dir = tmp_path / "facts", tmp_path / "run"
    job_id = random.randint(100000, 999999)  # submitit derives MASTER_PORT from the job id
    tasks = [subprocess.Popen([sys.executable, str(train_script), *BATCH, f"+test.out={out}",
                               f"hydra.run.dir={run_dir}"], cwd=str(tmp_path), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=slurm_task_env(job_id=job_id, procid=i, ntasks=2, nodes=nodes, tasks_per_node=1))
             for i in range(2)]
    for task in tasks:
        _, stderr = task.communicate(timeout=180)
        assert task.returncode == 0, stderr
    facts = rank_facts(out)
    assert [f["rank"] for f in facts] == [0, 1]
    assert [f["LOCAL_RANK"] for f in facts] == ["0", "0"]  # one task on each node
    assert {f["WORLD_SIZE"] for f in facts} == {"2"} and {f["allreduce"] for f in facts} == {3}
    assert {f["MASTER_ADDR"] for f in facts} == {nodes[0]}
    saved = json.loads((run_dir / "ds_config.json").read_text())  # written once, by rank 0
    assert saved["train_batch_size"] == 2 * 3 * 2
    assert [f["ds"] for f in facts] == [saved] * 2
    assert not (run_dir / "logs").exists()  # ran in place: dsconf started no ranks of its own


@pytest.mark.skipif(not __import__("importlib").util.find_spec("hydra_plugins.hydra_submitit_launcher"),
                    reason="hydra-submitit-launcher is not installed (pip install dsconf[slurm])")
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
