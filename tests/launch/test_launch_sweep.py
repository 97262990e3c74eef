"""``python train.py -m hydra/launcher=dsconf ...``: every sweep job a distributed job, failures, packing, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from launch_helpers import alive, descendants, rank_facts, run_script, wait_for

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=1",
         "dist.start_method=auto"]


def sweep(train_script: Path, sweep_dir: Path, *overrides: str, timeout: float = 180,
          env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return run_script(train_script, "-m", "hydra/launcher=dsconf", *BATCH, *overrides,
                      f"hydra.sweep.dir={sweep_dir}", timeout=timeout, env=env)


@pytest.mark.slow  # sweeps
def test_sweep_runs_each_job_on_its_own_world_and_reports_the_failed_one(train_script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = sweep(train_script, sweep_dir, "dist.nproc_per_node=1,2", "+test.which=a,b", "+test.fail_rank=1",
                 "+test.fail_which=b")
    assert proc.returncode == 1  # Hydra's sweeper re-raises the failed job after the whole batch ran
    summary = json.loads((sweep_dir / "summary.json").read_text())
    jobs = summary["jobs"]
    assert [j["status"] for j in jobs] == ["COMPLETED", "COMPLETED", "COMPLETED", "FAILED"]
    assert summary["counts"] == {"COMPLETED": 3, "FAILED": 1, "SKIPPED": 0}
    assert jobs[3]["result"].startswith("rank 1 failed: ValueError: boom from rank 1")
    assert "ValueError: boom from rank 1" in jobs[3]["error"] and "Traceback" in jobs[3]["error"]
    assert jobs[2]["result"] == repr({"rank": 0, "world": 2, "which": "a"})
    assert jobs[2]["metrics"] == {"rank": 0, "world": 2} and jobs[3]["metrics"] == {}  # the dict's numbers
    table = (sweep_dir / "summary.md").read_text()
    assert "| 3 | dist.nproc_per_node=2 +test.which=b" in table and "FAILED" in table
    assert "| job | overrides | status | wall (s) | result / error |" in proc.stdout
    for num, world in enumerate([1, 1, 2, 2]):
        job_dir = sweep_dir / str(num)
        facts = rank_facts(job_dir)
        assert {f["WORLD_SIZE"] for f in facts} == {str(world)} and len(facts) == world
        assert {f["output_dir"] for f in facts} == {str(job_dir)} and {f["job_num"] for f in facts} == {num}
        saved = json.loads((job_dir / "ds_config.json").read_text())
        assert saved["train_batch_size"] == 2 * 1 * world and [f["ds"] for f in facts] == [saved] * world
        assert (job_dir / ".hydra" / "overrides.yaml").exists()
        assert {p.name for p in (job_dir / "logs").glob("*.log")} == {
            f"rank{r}.{s}.log" for r in range(world) for s in ("stdout", "stderr")}
    assert "boom from rank 1" in (sweep_dir / "3" / "logs" / "rank1.stderr.log").read_text()


@pytest.mark.slow  # sweeps
def test_parallel_jobs_overlap_each_on_its_own_devices(train_script: Path, tmp_path: Path) -> None:
    """4 devices (named by CUDA_VISIBLE_DEVICES; torch's CPU build ignores it), 2-rank jobs, 2 at a time."""
    sweep_dir = tmp_path / "sweep"
    proc = sweep(train_script, sweep_dir, "hydra.launcher.max_parallel_jobs=2", "dist.nproc_per_node=2",
                 "dist.start_method=fork", "+test.which=a,b,c,d", "+test.sleep=2",
                 env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads((sweep_dir / "summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["COMPLETED"] * 4
    started = sorted((p.stat().st_mtime, p.parent.name) for p in sweep_dir.glob("*/rank0-*.json"))
    # rank facts are written before each job's 2 s sleep: two jobs at a time start within ~2 s of each other
    assert started[1][0] - started[0][0] < 1.5 and started[3][0] - started[2][0] < 1.5
    devices = {job: {f["CUDA_VISIBLE_DEVICES"] for f in rank_facts(sweep_dir / job)} for job in "0123"}
    assert all(len(d) == 1 and next(iter(d)) in ("0,1", "2,3") for d in devices.values())
    for (_, first), (_, second) in (started[:2], started[2:]):  # jobs running together never share a device
        assert devices[first] != devices[second]


@pytest.mark.slow  # sweeps
def test_fail_fast_skips_the_rest(train_script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = sweep(train_script, sweep_dir, "hydra.launcher.fail_fast=true", "dist.nproc_per_node=1",
                 "+test.which=a,b,c", "+test.fail_rank=0", "+test.fail_which=a")
    assert proc.returncode == 1
    jobs = json.loads((sweep_dir / "summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["FAILED", "SKIPPED", "SKIPPED"]
    assert not (sweep_dir / "1").exists()


@pytest.mark.slow  # sweeps
def test_hung_job_is_ended_by_its_timeout_and_the_sweep_goes_on(train_script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = sweep(train_script, sweep_dir, "dist.nproc_per_node=2", "+test.which=a,b", "+test.sleep=300",
                 "dist.timeout=3")
    assert proc.returncode == 1
    jobs = json.loads((sweep_dir / "summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["FAILED", "FAILED"]
    assert all(j["result"].startswith("job timed out after 3 s (dist.timeout)") for j in jobs)
    assert alive([f["pid"] for f in rank_facts(sweep_dir / "0") + rank_facts(sweep_dir / "1")]) == []


@pytest.mark.slow  # sweeps
def test_ctrl_c_stops_every_rank_of_every_running_job(train_script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, str(train_script), "-m", "hydra/launcher=dsconf", *BATCH,
                             "hydra.launcher.max_parallel_jobs=2", "dist.nproc_per_node=2", "+test.which=a,b,c",
                             "+test.sleep=300", f"hydra.sweep.dir={sweep_dir}"],
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(list(sweep_dir.glob("*/rank*.json"))) == 4, what="2 jobs x 2 ranks to start")
        family = descendants(proc.pid)
        ranks = [f["pid"] for job in ("0", "1") for f in rank_facts(sweep_dir / job)]
        assert set(ranks) <= set(family)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    wait_for(lambda: alive(family) == [], timeout=10, what="every job process and rank to exit")
    jobs = json.loads((sweep_dir / "summary.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["FAILED", "FAILED", "SKIPPED"]
    assert all("SIGTERM" in j["result"] or "SIGINT" in j["result"] for j in jobs[:2])


@pytest.mark.parametrize("visible,expected", [
    ("0,1,-1,2", ["0", "1"]),  # CUDA stops at the first invalid entry
    ("4,5,6,7", ["4", "5", "6", "7"]),
    ("3,3", []),  # a repeated ordinal: CUDA sees no device
    ("", []),
])
def test_device_pool_reads_cuda_visible_devices_as_cuda_does(monkeypatch, visible, expected) -> None:
    """Finding 8: parallel jobs were handed entries CUDA never shows (``0,1,-1,2`` gave 3 devices)."""
    from dsconf.launch.sweep import DevicePool

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert DevicePool.detect().total == expected
