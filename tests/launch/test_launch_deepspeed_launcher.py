"""DeepSpeed's own launcher runs a dsconf app unchanged: ``deepspeed --num_accelerators 2 examples/train.py`` (the CPU
form of choosing the ranks; without it the CPU accelerator counts NUMA nodes) and ``deepspeed --hostfile`` with two
"hosts", reached through stand-ins for ``pdsh`` and ``ssh`` (``standins/``) that run the commands here, in a fresh
login environment as a real ssh would. The launcher appends ``--local_rank=N`` to the script's arguments: dropped."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE_PROBE, clean_env, free_port, logs_text, rank_facts, run_nodes

DEEPSPEED = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
STANDINS = Path(__file__).parent / "standins"
pytestmark = [pytest.mark.skipif(DEEPSPEED is None, reason="DeepSpeed's launcher is not installed"),
              pytest.mark.slow]  # DeepSpeed ranks


def check_example_run(out: Path, facts_dir: Path, ranks: list) -> None:
    facts = rank_facts(facts_dir)
    assert [(f["RANK"], f["LOCAL_RANK"], f["WORLD_SIZE"]) for f in facts] == ranks
    saved = json.loads((out / "ds_config.json").read_text())  # one, for the world of 2, written by rank 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert saved["train_batch_size"] == saved["train_micro_batch_size_per_gpu"] * 2 == metrics["train_batch_size"]
    assert metrics["world_size"] == 2 and not (out / "logs").exists()  # in place: dsconf started no ranks
    overrides = (out / ".hydra" / "overrides.yaml").read_text()
    assert "local_rank" not in overrides and "train.steps=2" in overrides


def test_deepspeed_launcher_on_one_node(tmp_path: Path) -> None:
    probe, out, facts = tmp_path / "train.py", tmp_path / "run", tmp_path / "facts"
    probe.write_text(EXAMPLE_PROBE)
    log = tmp_path / "deepspeed.log"
    codes = run_nodes([[DEEPSPEED, "--num_accelerators", "2", "--master_port", str(free_port()), str(probe),
                        "train.steps=2", f"hydra.run.dir={out}"]],
                      [clean_env(DSCONF_PROBE_OUT=str(facts))], [log], tmp_path, timeout=300)
    assert codes == [0], logs_text([log])
    assert "--local_rank=1" in log.read_text()  # what DeepSpeed appended, and the app ran all the same
    check_example_run(out, facts, [("0", "0", "2"), ("1", "1", "2")])


def test_deepspeed_launcher_with_a_hostfile_of_two_hosts(tmp_path: Path) -> None:
    probe, out, facts = tmp_path / "train.py", tmp_path / "run", tmp_path / "facts"
    probe.write_text(EXAMPLE_PROBE)
    (tmp_path / "hostfile").write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    # a remote shell gets the launcher's exports (PYTHON*, ...) and what .deepspeed_env in the working dir lists
    remote = {"DS_ACCELERATOR": "cpu", "DSCONF_PROBE_OUT": str(facts)}
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        remote["TORCH_EXTENSIONS_DIR"] = os.environ["TORCH_EXTENSIONS_DIR"]
    (tmp_path / ".deepspeed_env").write_text("".join(f"{k}={v}\n" for k, v in remote.items()))
    ssh_log, log = tmp_path / "ssh.log", tmp_path / "deepspeed.log"
    env = clean_env(PATH=os.pathsep.join([str(STANDINS), os.environ["PATH"]]), SSH_STANDIN_LOG=str(ssh_log))
    codes = run_nodes([[DEEPSPEED, "--hostfile", "hostfile", "--master_port", str(free_port()), str(probe),
                        "train.steps=2", f"hydra.run.dir={out}"]], [env], [log], tmp_path, timeout=300)
    assert codes == [0], logs_text([log, ssh_log])
    reached = [line.split("\t", 1) for line in ssh_log.read_text().splitlines()]
    launched = [host for host, command in reached if "deepspeed.launcher.launch" in command]
    assert sorted(launched) == ["127.0.0.1", "localhost"]  # each host started its rank through pdsh and ssh
    assert "localhost: " in log.read_text() and "127.0.0.1: " in log.read_text()  # pdsh's prefixed output
    check_example_run(out, facts, [("0", "0", "2"), ("1", "0", "2")])
