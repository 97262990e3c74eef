"""Each environment's detection from its variables alone, as the real launcher or operator sets them: the rank or
the dist settings it yields, the detection order where environments overlap, partial environments and contradicting
``dist.*`` settings (each a one-line error naming both sides), and DeepSpeed's ``--local_rank`` argument."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dsconf.errors import ConfigError
from dsconf.launch.environments import ORDER, detect, export_rank, settled_dist
from dsconf.launch.environments.base import MAX_PORT, MIN_PORT
from dsconf.launch.environments.torchrun import local_rank_dropped
from dsconf.schema.dist import DistConfig

DIST = asdict(DistConfig())


def ompi(rank: int, size: int = 2, local_size: int = 2, **extra: str) -> dict:
    """What Open MPI 5's mpiexec gives a rank (the PMIx namespace names the job)."""
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
            "OMPI_COMM_WORLD_NODE_RANK": str(rank % local_size), "PMIX_RANK": str(rank),
            "PMIX_NAMESPACE": "prterun-vm-13084@1", "OMPI_UNIVERSE_SIZE": str(size), **extra}


def hydra_mpi(rank: int, size: int = 4, local_size: int = 2, **extra: str) -> dict:
    """What MPICH's and Intel MPI's Hydra give a rank."""
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(rank % local_size),
            "MPI_LOCALNRANKS": str(local_size), "PMI_FD": "6", **extra}


def trainer_v2(node_rank: int, nodes: int = 2, nproc: str = "2") -> dict:
    """Kubeflow Trainer's torch runtime: torchrun's flags as PET_* (node rank from the Job's completion index)."""
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(node_rank),
            "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": str(node_rank),
            "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def pytorchjob_v1(pod: int, pods: int = 2, nproc: str = "2") -> dict:
    """PyTorchJob (training-operator v1) with a Master replica: one process a pod unless nprocPerNode is a number."""
    world = pods * (int(nproc) if nproc.isdigit() else 1)
    return {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "PET_MASTER_ADDR": "job-master-0",
            "PET_MASTER_PORT": "23456", "WORLD_SIZE": str(world), "RANK": str(pod), "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(pod), "PET_NNODES": str(pods), "PYTHONUNBUFFERED": "0",
            "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def skypilot(node_rank: int, nodes: int = 2, gpus: int = 2, **extra: str) -> dict:
    ips = "\n".join(f"10.0.0.{i + 1}" for i in range(nodes))
    return {"SKYPILOT_NODE_IPS": ips, "SKYPILOT_NODE_RANK": str(node_rank), "SKYPILOT_NUM_NODES": str(nodes),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus), "SKYPILOT_TASK_ID": "sky-2026-12-04-10-00-00-000000_c_1",
            **extra}


def one_line_error(env: dict, *, dist: Any = None, gpus: int = 0) -> str:
    with pytest.raises(ConfigError) as info:
        found = detect(env, gpus=gpus, query=False)
        settled_dist(found, {**DIST, **(dist or {})})
    text = str(info.value)
    assert "\n" not in text and len(info.value.problems) == 1, text
    return text


# ------------------------------------------------------------------------------------------------- in place
def test_open_mpi_ranks_on_one_node_use_this_host_and_a_port_of_the_job() -> None:
    ranks = [detect(ompi(r), gpus=0).rank for r in range(2)]
    assert [(r.rank, r.local_rank, r.world_size, r.local_world_size) for r in ranks] == [(0, 0, 2, 2), (1, 1, 2, 2)]
    assert {r.master_addr for r in ranks} == {"127.0.0.1"}  # every rank is on this host
    assert len({r.master_port for r in ranks}) == 1 and MIN_PORT <= ranks[0].master_port <= MAX_PORT
    other_job = detect(ompi(0, PMIX_NAMESPACE="prterun-vm-999@1"), gpus=0).rank
    assert other_job.master_port != ranks[0].master_port


def test_open_mpi_master_address_yours_then_the_hostfile_then_mpi(tmp_path: Path) -> None:
    two_nodes = ompi(3, size=4, local_size=2)
    assert detect({**two_nodes, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29600"}).rank.master_addr == "10.1.1.1"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# Kubeflow's MPI hostfile\n\njob-launcher.job.default.svc slots=2\njob-worker-0 slots=2\n")
    found = detect({**two_nodes, "OMPI_MCA_orte_default_hostfile": str(hostfile)})
    assert found.rank.master_addr == "job-launcher.job.default.svc"
    assert (found.rank.rank, found.rank.local_rank, found.rank.node_rank, found.rank.local_world_size) == (3, 1, 1, 2)
    assert str(hostfile) in found.sources["MASTER_ADDR"]
    hostfile.write_text("node7:4\nnode8:4\n")  # MPICH's form
    assert detect({**hydra_mpi(5, size=8, local_size=4), "HYDRA_HOST_FILE": str(hostfile)}).rank.master_addr == "node7"
    # a hostfile mounted on the launcher's pod only: MPI itself is asked (named, not asked, with query=False)
    found = detect({**two_nodes, "OMPI_MCA_orte_default_hostfile": str(tmp_path / "absent")}, query=False)
    assert "mpi4py" in found.sources["MASTER_ADDR"]


def test_open_mpi_across_nodes_without_an_address_or_mpi4py_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if mpi4py were not installed
    assert "MASTER_ADDR: is needed" in one_line_error(ompi(0, size=4, local_size=2))


@pytest.mark.parametrize("drop,expected", [
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE: is not set"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK: is not set"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE: is not set")])
def test_a_partial_open_mpi_environment_is_a_one_line_error(drop: str, expected: str) -> None:
    env = ompi(1)
    del env[drop]
    assert expected in one_line_error(env)


def test_open_mpi_values_out_of_range_are_one_line_errors() -> None:
    assert "OMPI_COMM_WORLD_RANK: 2 is not below OMPI_COMM_WORLD_SIZE=2" in one_line_error(ompi(2))
    assert "'two' is not a number" in one_line_error({**ompi(0), "OMPI_COMM_WORLD_SIZE": "two"})


def test_mpich_and_intel_mpi_ranks() -> None:
    rank = detect(hydra_mpi(3, MASTER_ADDR="head", MASTER_PORT="29501"), gpus=0).rank
    assert (rank.rank, rank.local_rank, rank.world_size, rank.local_world_size, rank.node_rank) == (3, 1, 4, 2, 1)
    assert (rank.master_addr, rank.master_port) == ("head", 29501)
    env = hydra_mpi(1)
    del env["MPI_LOCALRANKID"]  # PMI_RANK of a job of 4 without Hydra's local rank
    assert "MPI_LOCALRANKID: is not set" in one_line_error(env)


def test_overlapping_environments_are_settled_by_the_order() -> None:
    from test_environment_slurm import srun_env

    slurm = srun_env(5)
    # mpirun inside a SLURM allocation: the ranks' SLURM variables describe MPI's daemons
    assert detect({**slurm, **ompi(1, size=4)}, gpus=0).name == "openmpi"
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE in tasks SLURM describes
    assert detect({**slurm, "PMI_RANK": "5", "PMI_SIZE": "8"}, gpus=0).name == "slurm"
    # torchrun (or DeepSpeed's launcher) inside a Kubeflow pod or a SLURM task: a rank of torchrun
    torchrun = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n0", "MASTER_PORT": "29500",
                "TORCHELASTIC_RUN_ID": "x"}
    assert detect({**trainer_v2(1), **torchrun}, gpus=0).name == "torchrun"
    assert detect({**slurm, **torchrun}, gpus=0).name == "torchrun"
    # a PyTorchJob pod with nprocPerNode=2 has RANK (the pod's index) and WORLD_SIZE too: it is a node's launcher
    assert detect(pytorchjob_v1(1, nproc="2"), gpus=0).name == "kubeflow"
    assert detect(pytorchjob_v1(1, nproc="auto"), gpus=0).name == "pytorchjob"
    assert [a.name for a in ORDER] == ["torchrun", "openmpi", "mpich", "slurm", "submitit_local", "kubeflow",
                                       "pytorchjob", "skypilot"]
    assert detect({"HOME": "/root", "PATH": "/usr/bin"}) is None


def test_torchrun_and_deepspeed_launcher_ranks_export_nothing() -> None:
    deepspeed = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"}
    found = detect(deepspeed, gpus=0)
    assert found.title == "DeepSpeed's launcher (deepspeed)" and found.exported == ()
    assert (found.rank.rank, found.rank.local_world_size) == (1, 2)
    env = dict(deepspeed)
    export_rank(found, env)
    assert env == deepspeed


def test_pytorchjob_one_process_per_pod_is_local_rank_0_of_its_node() -> None:
    env = pytorchjob_v1(1, nproc="auto")
    found = detect(env, gpus=0)
    assert (found.rank.rank, found.rank.world_size, found.rank.local_rank, found.rank.node_rank) == (1, 2, 0, 1)
    export_rank(found, env)
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["RANK"]) == ("0", "1", "1", "1")
    assert "WORLD_SIZE: is not set" in one_line_error({"RANK": "0"})
    assert "MASTER_ADDR: is not set, but WORLD_SIZE=2" in one_line_error({"RANK": "0", "WORLD_SIZE": "2"})


# ------------------------------------------------------------------------------------------- node launchers
def test_kubeflow_trainer_torch_runtime_becomes_torchruns_settings() -> None:
    found = detect(trainer_v2(1), gpus=0)
    assert not found.in_place
    assert found.dist == {"nnodes": "2", "nproc_per_node": 2, "node_rank": 1, "rdzv_backend": "static",
                          "rdzv_endpoint": "job-node-0-0.job:29500"}
    settled = settled_dist(found, DIST)
    assert (settled["nnodes"], settled["nproc_per_node"], settled["rdzv_backend"]) == ("2", 2, "static")
    assert settled["timeout"] is None and settled["init_timeout"] == DIST["init_timeout"]  # the rest: dist's


def test_kubeflow_elastic_policy_and_auto_processes() -> None:
    env = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_NNODES": "1:3",
           "PET_MAX_RESTARTS": "3", "PET_NPROC_PER_NODE": "auto", "PET_RDZV_ID": "job",
           "PET_RDZV_CONF": "join_timeout=60,last_call_timeout=5"}
    found = detect(env, gpus=0)
    assert found.dist == {"nnodes": "1:3", "rdzv_backend": "c10d", "rdzv_endpoint": "job-worker-0:23456",
                          "rdzv_id": "job", "rdzv_conf": {"join_timeout": "60", "last_call_timeout": "5"},
                          "max_restarts": 3}
    assert settled_dist(found, DIST)["nproc_per_node"] == "cpu"  # torchrun's auto without GPUs: a rank per CPU
    assert detect(env, gpus=4).defaults == {"nproc_per_node": 4}
    assert settled_dist(found, {**DIST, "nproc_per_node": 2})["nproc_per_node"] == 2  # auto says nothing: yours


@pytest.mark.parametrize("change,expected", [
    ({"PET_NODE_RANK": None}, "PET_NODE_RANK: is not set"),
    ({"PET_MASTER_ADDR": None}, "PET_MASTER_ADDR: is not set, but PET_NNODES=2"),
    ({"PET_NNODES": "two"}, "PET_NNODES: 'two' is not 'N' or 'MIN:MAX'"),
    ({"PET_NODE_RANK": "2"}, "PET_NODE_RANK: 2 is not below PET_NNODES=2"),
    ({"PET_RDZV_BACKEND": "c10d"}, "PET_RDZV_ENDPOINT: is not set"),
    ({"PET_NPROC_PER_NODE": "many"}, "PET_NPROC_PER_NODE: 'many' is not a number of processes")])
def test_a_partial_kubeflow_environment_is_a_one_line_error(change: dict, expected: str) -> None:
    env = {k: v for k, v in {**trainer_v2(1), **change}.items() if v is not None}
    assert expected in one_line_error(env)


def test_skypilot_nodes_become_a_static_rendezvous_at_the_first_ip() -> None:
    nodes = [detect(skypilot(r), gpus=0) for r in range(2)]
    assert [f.dist["node_rank"] for f in nodes] == [0, 1]
    assert {f.dist["rdzv_endpoint"] for f in nodes} == {nodes[0].dist["rdzv_endpoint"]}  # the same on every node
    assert nodes[0].dist["rdzv_endpoint"].startswith("10.0.0.1:")
    assert (nodes[0].dist["nnodes"], nodes[0].dist["nproc_per_node"], nodes[0].dist["rdzv_backend"]) == \
        ("2", 2, "static")
    assert detect(skypilot(0, MASTER_PORT="8008")).dist["rdzv_endpoint"] == "10.0.0.1:8008"
    cpu_cluster = detect(skypilot(0, nodes=1, gpus=0))
    assert cpu_cluster.dist == {"nnodes": "1"}  # one node: dsconf's own rendezvous; ranks from dist
    assert settled_dist(cpu_cluster, {**DIST, "nproc_per_node": 2})["nproc_per_node"] == 2


@pytest.mark.parametrize("change,expected", [
    ({"SKYPILOT_NODE_IPS": "10.0.0.1"}, "SKYPILOT_NODE_IPS: lists 1 IP(s), but SKYPILOT_NUM_NODES=2"),
    ({"SKYPILOT_NODE_RANK": None}, "SKYPILOT_NODE_RANK: is not set"),
    ({"SKYPILOT_NUM_NODES": None}, "SKYPILOT_NUM_NODES: is not set"),
    ({"SKYPILOT_NODE_IPS": None}, "SKYPILOT_NODE_IPS: is not set"),
    ({"SKYPILOT_NODE_RANK": "5"}, "SKYPILOT_NODE_RANK: 5 is not below SKYPILOT_NUM_NODES=2")])
def test_a_partial_skypilot_environment_is_a_one_line_error(change: dict, expected: str) -> None:
    env = {k: v for k, v in {**skypilot(1), **change}.items() if v is not None}
    assert expected in one_line_error(env)


# ------------------------------------------------------------------------------------ the user's dist settings
@pytest.mark.parametrize("env,dist,expected", [
    (trainer_v2(0), {"nnodes": 3}, "dist.nnodes: 3 contradicts PET_NNODES=2"),
    (trainer_v2(0), {"nproc_per_node": 4}, "dist.nproc_per_node: 4 contradicts PET_NPROC_PER_NODE=2"),
    (trainer_v2(0), {"rdzv_endpoint": "10.9.9.9:29400"}, "dist.rdzv_endpoint: '10.9.9.9:29400' contradicts "
                                                         "PET_MASTER_ADDR=job-node-0-0.job"),
    (skypilot(0), {"node_rank": 1}, "dist.node_rank: 1 contradicts SKYPILOT_NODE_RANK=0"),
    (ompi(0), {"nproc_per_node": 2}, "dist.nproc_per_node: 2 would start 2 ranks in each of the 2 processes Open "
                                     "MPI (mpirun/mpiexec) started (OMPI_COMM_WORLD_SIZE=2): ranks would multiply"),
    (ompi(0, size=4), {"nnodes": 3}, "dist.nnodes: 3 contradicts the 2 node(s) of Open MPI"),
    (ompi(1, size=4), {"node_rank": 1}, "dist.node_rank: 1 contradicts node 0 of Open MPI"),
    (ompi(0, MASTER_ADDR="n0"), {"rdzv_endpoint": "n1:29500"}, "dist.rdzv_endpoint: 'n1:29500' contradicts "
                                                               "MASTER_ADDR=n0"),
])
def test_a_dist_setting_that_contradicts_the_environment_is_a_one_line_error(env: dict, dist: dict,
                                                                              expected: str) -> None:
    assert expected in one_line_error(env, dist=dist)


def test_dist_settings_that_agree_with_the_environment_or_that_it_does_not_state_are_kept() -> None:
    found = detect(trainer_v2(1), gpus=0)
    settled = settled_dist(found, {**DIST, "nnodes": 2, "nproc_per_node": "2", "timeout": 90.0,
                                   "rdzv_endpoint": "job-node-0-0.job:29411"})
    assert settled["timeout"] == 90.0 and settled["rdzv_endpoint"] == "job-node-0-0.job:29411"  # your port
    in_place = detect(ompi(2, size=4), gpus=0)
    assert settled_dist(in_place, {**DIST, "nnodes": "2", "node_rank": 1, "timeout": 60.0})["timeout"] == 60.0


# ------------------------------------------------------------------------------- DeepSpeed's --local_rank=N
@pytest.mark.parametrize("argv", [["--local_rank=1", "zero=stage2"], ["--local-rank=1", "zero=stage2"],
                                  ["zero=stage2", "--local_rank", "1"]])
def test_deepspeeds_local_rank_argument_is_dropped(argv: list) -> None:
    env = {"RANK": "1", "LOCAL_RANK": "1"}
    assert local_rank_dropped(argv, env) == ["zero=stage2"] and env["LOCAL_RANK"] == "1"
    env = {}  # torch.distributed.launch without --use-env: the argument alone says it
    assert local_rank_dropped(argv, env) == ["zero=stage2"] and env == {"LOCAL_RANK": "1"}


def test_a_local_rank_argument_that_disagrees_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="--local_rank: 1 disagrees with LOCAL_RANK=0"):
        local_rank_dropped(["--local_rank=1"], {"LOCAL_RANK": "0"})
    with pytest.raises(ConfigError, match="'x' is not a local rank"):
        local_rank_dropped(["--local_rank=x"], {})


def test_other_hydra_apps_still_refuse_local_rank(tmp_path: Path) -> None:
    """Only dsconf apps drop it: a plain Hydra app in the same environment sees Hydra's own refusal."""
    app = tmp_path / "app.py"
    app.write_text("import hydra\n\n@hydra.main(config_path=None, version_base=None)\ndef main(cfg):\n"
                   "    print('ran')\n\nif __name__ == '__main__':\n    main()\n")
    proc = subprocess.run([sys.executable, str(app), "--local_rank=1"], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "unrecognized arguments: --local_rank=1" in proc.stderr


# --------------------------------------------------------------------------------- dsconf show --explain-launch
def explain(monkeypatch, capsys, env: dict, *overrides: str) -> tuple:
    from dsconf.cli import main

    for name in [*os.environ]:
        if name.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_", "SUBMITIT_", "PET_", "SKYPILOT_")) or name in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["show", "--explain-launch", *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_launch_of_a_kubeflow_pod(monkeypatch, capsys) -> None:
    code, out, _ = explain(monkeypatch, capsys, trainer_v2(1), "dist.timeout=60")
    assert code == 0
    assert "environment: Kubeflow (Trainer's torch runtime, PyTorchJob with nprocPerNode) (adapter kubeflow, " \
           "tried 6 of 8)" in out
    for line in ("  PET_NODE_RANK=1", "  nodes: 2 (PET_NNODES=2)", "  ranks per node: 2 (PET_NPROC_PER_NODE=2)",
                 "  node rank: 1 (PET_NODE_RANK=1)", "  rendezvous: static at job-node-0-0.job:29500 "
                 "(PET_MASTER_ADDR=job-node-0-0.job, PET_MASTER_PORT=29500)", "  world size: 4;"):
        assert line in out, out


def test_explain_launch_of_an_mpi_rank_and_of_no_environment(monkeypatch, capsys) -> None:
    code, out, _ = explain(monkeypatch, capsys, ompi(1))
    assert code == 0 and "this process is rank 1 of 2, started by Open MPI (mpirun/mpiexec)" in out
    assert "  master: 127.0.0.1 (this host: every rank of the job is on it)" in out
    assert "  OMPI_COMM_WORLD_LOCAL_SIZE=2" in out
    _, out, _ = explain(monkeypatch, capsys, skypilot(1))
    assert "  SKYPILOT_NODE_IPS=10.0.0.1\\n10.0.0.2" in out and "  nodes: 2 (SKYPILOT_NUM_NODES=2)" in out
    code, out, _ = explain(monkeypatch, capsys, {}, "dist.nproc_per_node=2")
    assert code == 0 and out.startswith("environment: none detected, dsconf's dist decides")
    assert "  ranks per node: 2 (dist.nproc_per_node=2, yours)" in out and "world size: 2;" in out


def test_explain_launch_reports_a_contradiction_as_the_run_would(monkeypatch, capsys) -> None:
    code, out, err = explain(monkeypatch, capsys, ompi(0), "dist.nproc_per_node=2")
    assert code == 2 and out == "" and err.count("\n") == 1 and "ranks would multiply" in err
