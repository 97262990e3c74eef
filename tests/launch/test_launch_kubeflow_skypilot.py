"""Kubeflow pods and SkyPilot nodes on loopback: each "pod"/"node" is a process with the variables the operator
sets for it, running ``python train.py`` as its container or ``run`` section would. The pods of Kubeflow's torch
runtime and SkyPilot's nodes are nodes' launchers (dsconf starts their ranks, as torchrun would); PyTorchJob's pod
per rank is a rank itself. Each job's ranks check their world with an all-reduce, or train the example with
DeepSpeed, and every rank's RANK, LOCAL_RANK and WORLD_SIZE are checked."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE_PROBE, TRAIN_SCRIPT, clean_env, free_port, logs_text, rank_facts, run_nodes

from dsconf.launch.environments.base import derived_port

pytestmark = pytest.mark.slow  # each test runs a job of 2 to 4 ranks over 2 processes
STEPS = ["train.steps=2"]
BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=3"]


def trainer_pod(node_rank: int, port: int) -> dict:
    """Kubeflow Trainer's torch runtime, numProcPerNode=2 and numNodes=2 (the master: pod 0's hostname)."""
    return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(node_rank),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "JOB_COMPLETION_INDEX": str(node_rank),
            "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def pytorchjob_pod(index: int, port: int, nproc: str) -> dict:
    """PyTorchJob (v1) with a Master replica and a Worker replica: pod ``index`` of 2."""
    world = 2 * (int(nproc) if nproc.isdigit() else 1)
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(world), "RANK": str(index), "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(index), "PET_NNODES": "2", "PYTHONUNBUFFERED": "0",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def skypilot_node(node_rank: int, task_id: str) -> dict:
    """A node of a 2-node SkyPilot cluster with 2 GPUs a node (both "nodes" are this host)."""
    return {"SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n", "SKYPILOT_NODE_RANK": str(node_rank),
            "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "2", "SKYPILOT_TASK_ID": task_id,
            "SKYPILOT_CLUSTER_INFO": "{}"}


def free_task_id() -> str:
    """A SkyPilot task id whose derived rendezvous port is free here."""
    for i in range(100):
        task_id = f"sky-2026-12-04-10-00-00-{i:06d}_test_1"
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", derived_port(task_id)))
                return task_id
            except OSError:
                continue
    raise AssertionError("no free derived port")


def run_pods(tmp_path: Path, script_text: str, envs: list, *args: str) -> Path:
    """Each pod: ``python train.py ARGS`` in a dir of its own, with its environment; returns the facts' dir."""
    script, facts = tmp_path / "train.py", tmp_path / "facts"
    script.write_text(script_text)
    logs = [tmp_path / f"pod{i}.log" for i in range(len(envs))]
    commands = [[sys.executable, str(script), *args, f"hydra.run.dir={tmp_path / f'pod{i}'}"]
                for i in range(len(envs))]
    full_envs = [clean_env(DSCONF_PROBE_OUT=str(facts), **env) for env in envs]
    codes = run_nodes(commands, full_envs, logs, tmp_path, timeout=400)
    assert codes == [0] * len(envs), logs_text([*logs, *sorted(tmp_path.glob("pod*/logs/*.log"))])
    return facts


def ranks_of(facts: list) -> list:
    return [(f["RANK"], f["LOCAL_RANK"], f["WORLD_SIZE"]) for f in facts]


def two_by_two(facts: list) -> None:
    assert ranks_of(facts) == [("0", "0", "4"), ("1", "1", "4"), ("2", "0", "4"), ("3", "1", "4")]


def check_example_job(tmp_path: Path, world: int, *, every_pod_saves: bool) -> None:
    """The dict for the world that ran: saved by every node's launcher, or (ranks in place) by rank 0's pod alone;
    rank 0 trained and wrote the metrics."""
    for pod in ("pod0", "pod1"):
        path = tmp_path / pod / "ds_config.json"
        if pod == "pod0" or every_pod_saves:
            saved = json.loads(path.read_text())
            assert saved["train_batch_size"] == saved["train_micro_batch_size_per_gpu"] * world
        else:
            assert not path.exists()
    metrics = json.loads((tmp_path / "pod0" / "metrics.json").read_text())
    assert metrics["world_size"] == world and metrics["final_loss"] is not None


def test_kubeflow_trainer_pods_train_the_example_on_2_x_2_ranks(tmp_path: Path) -> None:
    port = free_port()
    facts = run_pods(tmp_path, EXAMPLE_PROBE, [trainer_pod(n, port) for n in range(2)], *STEPS)
    two_by_two(rank_facts(facts))
    check_example_job(tmp_path, world=4, every_pod_saves=True)


def test_pytorchjob_with_nproc_per_node_pods_are_nodes_of_2_ranks(tmp_path: Path) -> None:
    port = free_port()
    facts = run_pods(tmp_path, TRAIN_SCRIPT, [pytorchjob_pod(n, port, "2") for n in range(2)], *BATCH,
                     f"+test.out={tmp_path / 'facts'}")
    facts_list = rank_facts(facts)
    two_by_two(facts_list)
    assert {f["allreduce"] for f in facts_list} == {10}
    for pod in ("pod0", "pod1"):  # each pod's launcher validated the dict for the world of 4
        assert json.loads((tmp_path / pod / "ds_config.json").read_text())["train_batch_size"] == 2 * 3 * 4


def test_pytorchjob_pod_per_rank_trains_the_example(tmp_path: Path) -> None:
    port = free_port()
    facts = run_pods(tmp_path, EXAMPLE_PROBE, [pytorchjob_pod(n, port, "auto") for n in range(2)], *STEPS)
    assert ranks_of(rank_facts(facts)) == [("0", "0", "2"), ("1", "0", "2")]
    check_example_job(tmp_path, world=2, every_pod_saves=False)
    assert not (tmp_path / "pod0" / "logs").exists()  # in place: each pod's process is the rank


def test_skypilot_nodes_train_the_example_on_2_x_2_ranks(tmp_path: Path) -> None:
    task_id = free_task_id()
    facts = run_pods(tmp_path, EXAMPLE_PROBE, [skypilot_node(n, task_id) for n in range(2)], *STEPS)
    facts_list = rank_facts(facts)
    two_by_two(facts_list)
    assert {f["MASTER_ADDR"] for f in facts_list} == {"127.0.0.1"}  # the first of SKYPILOT_NODE_IPS
    assert {f["MASTER_PORT"] for f in facts_list} == {str(derived_port(task_id))}
    check_example_job(tmp_path, world=4, every_pod_saves=True)
