"""``@dsconf.main`` scripts run as users run them: ``python train.py ...``, under torchrun, on 2 nodes, Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import alive, descendants, free_port, rank_facts, run_nodes, run_script, wait_for

# auto: fork on this GPU-less host (fast); the Ctrl-C test also covers spawn, the default with GPUs
BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=3",
         "dist.start_method=auto"]


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.slow  # starts ranks
def test_single_run_on_n_ranks(train_script: Path, tmp_path: Path, nproc: int) -> None:
    out = tmp_path / "run"
    proc = run_script(train_script, f"dist.nproc_per_node={nproc}", *BATCH, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    facts = rank_facts(out)
    saved = json.loads((out / "ds_config.json").read_text())
    assert [f["rank"] for f in facts] == list(range(nproc))
    for f in facts:
        assert f["WORLD_SIZE"] == str(nproc) and f["world"] == nproc
        assert f["allreduce"] == nproc * (nproc + 1) // 2
        assert f["ds"] == saved  # the exact dict handed to every rank
        assert f["output_dir"] == str(out) and f["DSCONF_DEEPSPEED_CONFIG"] == str(out / "ds_config.json")
        assert f["ppid"] != os.getpid()
        # the agent's own session and group, as torchrun's ranks have sessions of their own (the kernel's
        # autogroup scheduling then keeps them apart from the launcher's session); one killpg ends the job
        assert f["sid"] == f["pgid"] == f["ppid"] != os.getsid(0)
    assert saved["train_batch_size"] == 2 * 3 * nproc  # micro x gas x data-parallel size
    assert sorted(p.name for p in (out / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert {p.name for p in (out / "logs").iterdir()} == {
        f"rank{r}.{s}.log" for r in range(nproc) for s in ("stdout", "stderr")}
    assert f"[rank{nproc - 1}]:" in proc.stdout + proc.stderr  # ranks' output echoed with their rank


@pytest.mark.slow  # starts ranks
def test_data_parallel_size_divides_out_model_parallel(train_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_script(train_script, "dist.nproc_per_node=2", "dist.tensor_parallel_size=2", *BATCH,
                      f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert [f["WORLD_SIZE"] for f in rank_facts(out)] == ["2", "2"]
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 2 * 3 * 1


def test_config_error_is_short_and_launches_nothing(train_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_script(train_script, "dist.nproc_per_node=2", "deepspeed.train_batch_size=7",
                      "deepspeed.train_micro_batch_size_per_gpu=2", f"hydra.run.dir={out}")
    assert proc.returncode == 2
    assert proc.stderr.startswith("dsconf: invalid DeepSpeed config") and "Traceback" not in proc.stderr
    assert not (out / "logs").exists() and not (out / "ds_config.json").exists()


@pytest.mark.slow  # starts ranks
def test_failed_rank_exits_nonzero_with_its_error(train_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_script(train_script, "dist.nproc_per_node=2", *BATCH, "+test.fail_rank=1", f"hydra.run.dir={out}")
    assert proc.returncode == 1
    assert "dsconf: job failed: rank 1 failed: ValueError: boom from rank 1" in proc.stderr
    assert "boom from rank 1" in (out / "logs" / "rank1.stderr.log").read_text()


@pytest.mark.slow  # starts ranks
def test_same_script_runs_in_place_under_torchrun(train_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", str(train_script), *BATCH,
                           f"hydra.run.dir={out}"], cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    facts = rank_facts(out)
    assert [f["WORLD_SIZE"] for f in facts] == ["2", "2"]
    assert len({f["TORCHELASTIC_RUN_ID"] for f in facts}) == 1
    assert not (out / "logs").exists()  # torchrun's ranks were not relaunched by dsconf
    saved = json.loads((out / "ds_config.json").read_text())  # written by rank 0
    assert [f["ds"] for f in facts] == [saved, saved] and saved["train_batch_size"] == 2 * 3 * 2


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.slow  # starts ranks
def test_ctrl_c_leaves_no_process_behind(train_script: Path, tmp_path: Path, start_method: str) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(train_script), "dist.nproc_per_node=2", *BATCH,
                             f"dist.start_method={start_method}",
                             "+test.sleep=300", f"hydra.run.dir={out}"], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(list(out.glob("rank*.json"))) == 2, what="both ranks to start")
        ranks = [f["pid"] for f in rank_facts(out)]
        family = descendants(proc.pid)
        assert set(ranks) <= set(family)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr.split("dsconf:")[-1]
    wait_for(lambda: alive(family) == [], timeout=10, what=f"{alive(family)} to exit")


@pytest.mark.slow  # starts ranks
def test_two_nodes_on_localhost_form_one_world_of_4(train_script: Path, tmp_path: Path) -> None:
    out = tmp_path / "facts"
    port = free_port()
    # rendezvous and job bounded, and torch elastic's own log on: a node that hangs reports where it was
    commands = [[sys.executable, str(train_script), "dist.nnodes=2", "dist.nproc_per_node=2",
                 f"dist.rdzv_endpoint=127.0.0.1:{port}", "dist.rdzv_id=two-nodes", "+dist.rdzv_conf.join_timeout=90",
                 "dist.timeout=150", *BATCH, f"+test.out={out}", f"hydra.run.dir={tmp_path / f'node{n}'}"]
                for n in range(2)]
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    codes = run_nodes(commands, [{**os.environ, "LOGLEVEL": "INFO"}] * 2, logs, tmp_path, timeout=200)
    report = "\n".join(f"--- {path.relative_to(tmp_path)}\n{path.read_text()[-3000:]}"
                       for path in [*logs, *sorted(tmp_path.glob("node*/logs/*.log"))])
    assert codes == [0, 0], report
    facts = rank_facts(out)
    assert [f["rank"] for f in facts] == [0, 1, 2, 3]
    assert {f["WORLD_SIZE"] for f in facts} == {"4"} and {f["allreduce"] for f in facts} == {10}
    assert sorted(f["LOCAL_RANK"] for f in facts) == ["0", "0", "1", "1"]
    for node in ("node0", "node1"):  # each node's agent validated and saved the dict for the world of 4
        assert json.loads((tmp_path / node / "ds_config.json").read_text())["train_batch_size"] == 2 * 3 * 4
