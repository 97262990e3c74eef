"""``hydra/sweeper=dsconf_tune`` end to end: real studies of the example's model, 2 ranks on CPU, each trial a real
distributed job through dsconf's launcher.

The acceptance study (module fixture, shared by most tests): ZeRO stages 0-3 x micro batch {1, 2, 4}, global batch 8.
The task holds memory that grows with the micro batch (256 MiB a sample, touched: activations as the peak RSS sees
them), so the prior, fitted on the probe's two micro batches, predicts micro batch 4 over
``hydra.sweeper.memory_limit=1.25GiB``; stage 0 at micro batch 2 raises ``torch.OutOfMemoryError``. The study is
killed (SIGKILL to its whole process group) once three trials have finished, then the same command runs again and
finishes it. Smaller studies: a bug, a config mistake, a slow rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from browser import chromium, open_page
from launch_helpers import REPO, alive, descendants, wait_for
from optional_packages import requires

EXAMPLES = REPO / "examples"
GLOBAL_BATCH = 8
LIMIT = "1.25GiB"

TUNE_SCRIPT = f'''
"""The example's model under a tuning study, with the test's knobs (cfg.test)."""
import os, sys, time
sys.path.insert(0, {str(EXAMPLES)!r})
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from training import MarkovData, ModelConfig, TrainConfig, train
import dsconf

ConfigStore.instance().store(name="train_schema", node={{"model": ModelConfig, "train": TrainConfig}})


@dsconf.main(config_path={str(EXAMPLES / "conf")!r}, config_name="train", version_base=None)
def main(cfg):
    import torch
    from dsconf.launch.context import deepspeed_config, job_dir, report_sequence_length

    test = cfg.get("test") or {{}}
    ds = deepspeed_config()
    stage, micro = ds["zero_optimization"]["stage"], ds["train_micro_batch_size_per_gpu"]
    rank = int(os.environ["RANK"])
    if test.get("bug"):
        raise ValueError("a bug in the training function")
    if (stage, micro) == (test.get("oom_stage"), test.get("oom_micro")):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (the test's)")
    # memory that grows with the micro batch, as activations do; touched, so that the peak RSS holds it
    held = torch.ones(int(test.get("mib_per_sample", 0)) * micro * 2**18)
    if test.get("slow_rank") == rank:  # this rank's data loading is slow
        load = MarkovData.batch
        MarkovData.batch = lambda self, *args: (time.sleep(float(test.slow_s)), load(self, *args))[1]
    if test.get("no_allreduce"):  # ranks train on their own: no step waits for another rank
        import deepspeed
        initialize = deepspeed.initialize

        def independent(*args, **kwargs):
            out = initialize(*args, **kwargs)
            out[0].enable_backward_allreduce = False
            return out

        deepspeed.initialize = independent
    report_sequence_length(cfg.model.seq_len)
    m = train(ds, ModelConfig(**OmegaConf.to_container(cfg.model)), TrainConfig(**OmegaConf.to_container(cfg.train)),
              out_dir=job_dir())
    del held
    return float(m["final_loss"])


if __name__ == "__main__":
    main()
'''
SMALL = ["dist.nproc_per_node=2", "model.hidden=32", "model.layers=1", "deepspeed.train_micro_batch_size_per_gpu=4",
         "hydra.sweeper.steps=2", "hydra.sweeper.warmup_steps=1"]


def env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HYDRA_FULL_ERROR")}


def tune_command(script: Path, sweep_dir: Path, *args: str) -> List[str]:
    return [sys.executable, str(script), "-m", "hydra/sweeper=dsconf_tune", *SMALL, *args,
            f"hydra.sweep.dir={sweep_dir}"]


def run(command: List[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=str(cwd), env=env(), capture_output=True, text=True, timeout=timeout)


def trials(sweep_dir: Path) -> List[Dict[str, Any]]:
    try:
        return json.loads((sweep_dir / "trials.json").read_text())
    except (OSError, ValueError):
        return []


def by_key(sweep_dir: Path) -> Dict[str, Dict[str, Any]]:
    return {t["candidate"]: t for t in trials(sweep_dir)}


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune_script") / "tune_train.py"
    path.write_text(TUNE_SCRIPT)
    return path


# ------------------------------------------------------------------------------------ the acceptance study
@pytest.fixture(scope="module")
def study(script: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The study, killed after three finished trials, then resumed by the same command."""
    tmp = tmp_path_factory.mktemp("tune_study")
    sweep_dir = tmp / "sweep"
    command = tune_command(script, sweep_dir, "hydra.sweeper.top_k=1", "hydra.sweeper.top_k_steps=3",
                           "hydra.sweeper.space.offload=[none]", f"hydra.sweeper.memory_limit={LIMIT}",
                           "+test.oom_stage=0", "+test.oom_micro=2", "+test.mib_per_sample=256")
    log = (tmp / "first.log").open("w")
    first = subprocess.Popen(command, cwd=str(tmp), env=env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        wait_for(lambda: sum(t["status"] in ("ok", "infeasible") and t["job"] is not None
                             for t in trials(sweep_dir)) >= 3 or first.poll() is not None, timeout=400,
                 what="three finished trials")
        assert first.poll() is None, (tmp / "first.log").read_text()[-4000:]
        before = {t["candidate"]: t for t in trials(sweep_dir) if t["job"] is not None}
        stamps = {key: [p.stat().st_mtime for p in sorted((Path(t["job_dir"]) / "trial").glob("rank*.json"))]
                  for key, t in before.items()}
        family = [first.pid, *descendants(first.pid)]
        os.killpg(first.pid, signal.SIGKILL)  # the sweeper; its jobs and ranks die with it (parent-death signal)
        first.wait(timeout=30)
        wait_for(lambda: not alive(family), timeout=60, what="the killed study's processes to end")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        log.close()
    killed_at = time.time()
    second = run(command, tmp)
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    return {"dir": sweep_dir, "before": before, "stamps": stamps, "killed_at": killed_at, "second": second,
            "script": script, "tmp": tmp}


@pytest.mark.slow
def test_the_study_writes_every_result_file(study: Dict[str, Any]) -> None:
    sweep_dir = study["dir"]
    for name in ("best.yaml", "trials.json", "summary.md", "report.html", "tune.db"):
        assert (sweep_dir / name).is_file(), name
    records = trials(sweep_dir)
    expected = {f"stage={s} offload=none micro_batch={m}" for s in range(4) for m in (1, 2, 4)}
    assert {r["candidate"] for r in records} == expected  # one object per candidate
    for r in records:
        assert {"overrides", "stage", "offload", "micro_batch", "gradient_accumulation_steps", "train_batch_size",
                "status", "predicted_memory_bytes", "peak_memory_bytes", "step_time_s", "samples_per_s"} <= set(r)
        assert r["status"] in ("ok", "infeasible", "pruned", "failed")
    summary = (sweep_dir / "summary.md").read_text()
    assert sum(line.startswith("| ") for line in summary.splitlines()) == 2 + len(expected)
    winner = [r for r in records if r["winner"]]
    assert len(winner) == 1 and winner[0] == records[0] and winner[0]["status"] == "ok"
    assert f"best: `{winner[0]['candidate']}`" in summary
    ok = [r for r in records if r["status"] == "ok"]
    assert winner[0]["confirmed"]["steps"] == 3  # top_k=1: the best re-run for top_k_steps before it was named
    for r in ok:  # samples/s is the global batch over the slowest rank's step; tokens/s that times seq_len (32)
        assert r["samples_per_s"] == pytest.approx(GLOBAL_BATCH / r["step_time_s"])
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 32)
        assert len(r["rank_step_time_s"]) == len(r["rank_peak_memory_bytes"]) == 2
        assert r["environment"]["accelerator"] == "cpu" and r["environment"]["deepspeed"]


@pytest.mark.slow
def test_the_global_batch_is_the_same_in_every_trial(study: Dict[str, Any]) -> None:
    ran = [r for r in trials(study["dir"]) if r["job"] is not None]
    assert len(ran) >= 7
    for r in ran:
        assert r["train_batch_size"] == GLOBAL_BATCH
        assert r["micro_batch"] * r["gradient_accumulation_steps"] * 2 == GLOBAL_BATCH
        ds = json.loads((Path(r["job_dir"]) / "ds_config.json").read_text())  # what DeepSpeed was given
        assert ds["train_batch_size"] == GLOBAL_BATCH
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
            r["micro_batch"], r["gradient_accumulation_steps"])
        assert ds["zero_optimization"]["stage"] == r["stage"]


@pytest.mark.slow
def test_a_trial_out_of_memory_is_infeasible_and_the_study_goes_on(study: Dict[str, Any]) -> None:
    records = by_key(study["dir"])
    oom = records["stage=0 offload=none micro_batch=2"]
    assert oom["status"] == "infeasible" and "OutOfMemoryError" in oom["reason"], oom
    later = [r for r in records.values() if r["job"] is not None and r["job"] > oom["job"] and r["status"] == "ok"]
    assert later, "no trial ran after the out-of-memory one"


@pytest.mark.slow
def test_a_candidate_over_the_memory_limit_by_the_prior_is_skipped_with_its_prediction(study: Dict[str, Any]) -> None:
    from dsconf.tune.settings import parse_size

    limit = parse_size(LIMIT)
    records = by_key(study["dir"])
    for stage in range(4):
        r = records[f"stage={stage} offload=none micro_batch=4"]
        assert r["status"] == "pruned" and r["job"] is None, r
        assert r["predicted_memory_bytes"] > limit and r["memory_limit_bytes"] == limit
        assert r["reason"].startswith("predicted ") and "> limit 1.25 GiB (hydra.sweeper.memory_limit)" in r["reason"]
    for r in records.values():  # what ran was predicted to fit, and the probe's fit is close to what it measured
        if r["job"] is not None:
            assert r["predicted_memory_bytes"] <= limit, r
    probes = [r for r in records.values() if r["probe"]]
    assert sorted((r["stage"], r["micro_batch"]) for r in probes) == [(3, 1), (3, 2)]
    for r in probes:
        assert r["predicted_memory_bytes"] == pytest.approx(r["peak_memory_bytes"], rel=0.01)
    ran = {p.name for p in study["dir"].iterdir() if p.is_dir() and p.name.isdigit()}
    micro = {json.loads((study["dir"] / n / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"]
             for n in ran if (study["dir"] / n / "ds_config.json").exists()}
    assert 4 not in micro  # no job of micro batch 4 ever started


@pytest.mark.slow
def test_a_killed_study_resumes_without_rerunning_finished_trials(study: Dict[str, Any]) -> None:
    records = by_key(study["dir"])
    assert len(study["before"]) >= 3
    for key, earlier in study["before"].items():
        now = records[key]
        assert (now["job"], now["status"]) == (earlier["job"], earlier["status"]), key
        files = sorted((Path(now["job_dir"]) / "trial").glob("rank*.json"))
        assert [p.stat().st_mtime for p in files] == study["stamps"][key], f"{key} ran again"
        assert all(p.stat().st_mtime < study["killed_at"] for p in files)
    output = study["second"].stdout + study["second"].stderr
    assert f"resuming: {len(study['before'])} finished trial(s) taken from the study, not run again" in output
    for key in study["before"]:
        assert f": {key}\n" not in output.split("resuming:")[1], f"{key} was launched again"
    # every candidate ran at most once (the trial the kill interrupted ran again, in a job of its own)
    jobs = [r["job"] for r in records.values() if r["job"] is not None]
    assert len(jobs) == len(set(jobs))


@pytest.mark.slow
def test_best_yaml_composes_and_trains(study: Dict[str, Any]) -> None:
    sweep_dir = study["dir"]
    winner = trials(sweep_dir)[0]
    shown = subprocess.run([sys.executable, "-m", "dsconf.cli", "show", "--config-dir", str(sweep_dir),
                            "--config-name", "best"], capture_output=True, text=True, env=env(), timeout=120)
    assert shown.returncode == 0, shown.stderr
    # exactly the dict the winning trial handed to DeepSpeed
    assert json.loads(shown.stdout) == json.loads((Path(winner["job_dir"]) / "ds_config.json").read_text())
    trained = run([sys.executable, str(study["script"]), "--config-dir", str(sweep_dir), "--config-name", "best",
                   "train.steps=2", f"hydra.run.dir={study['tmp'] / 'best_run'}"], study["tmp"], timeout=300)
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-4000:]
    metrics = json.loads((study["tmp"] / "best_run" / "metrics.json").read_text())
    assert (metrics["zero_stage"], metrics["train_micro_batch_size_per_gpu"], metrics["train_batch_size"]) == (
        winner["stage"], winner["micro_batch"], GLOBAL_BATCH)
    assert metrics["steps"] == 2 and metrics["world_size"] == 2


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (scripts/setup.sh installs it where "
                    "apt-get exists: apt-get install chromium)")
def test_the_tune_report_as_a_person_sees_it(study: Dict[str, Any], tmp_path: Path,
                                             record_property: Any) -> None:
    shot = tmp_path / "tune_report.png"
    page = open_page(study["dir"] / "report.html", shot, tmp_path / "profile")
    record_property("screenshot", str(shot))
    print(f"screenshot: {shot}")
    assert [i["alt"] for i in page.images] == ["throughput vs peak memory", "step time per stage"]
    assert all(i["complete"] and i["naturalWidth"] > 0 for i in page.images), page.images
    assert page.errors == []
    assert shot.stat().st_size > 10_000
    html = (study["dir"] / "report.html").read_text()
    assert "<script" not in html and 'src="http' not in html  # self-contained


# ------------------------------------------------------------------------------------ smaller studies
@pytest.mark.slow
def test_a_trial_that_fails_for_another_reason_stops_the_study_in_one_line(script: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run(tune_command(script, sweep_dir, "hydra.sweeper.space.stage=[0,1]", "+test.bug=true"), tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dsconf:")
              and not line.startswith("dsconf: note:")]  # a note while a trial's ranks start is no error
    assert len(errors) == 1 and "Traceback" not in proc.stderr.split(errors[0])[1], proc.stderr[-3000:]
    head = "dsconf: tune: trial job 0 (stage=1 offload=optimizer micro_batch=1) failed: rank "
    assert errors[0].startswith(head), errors
    assert "ValueError: a bug in the training function" in errors[0]
    assert errors[0].endswith(f"logs: {sweep_dir / '0' / 'logs'}")
    records = trials(sweep_dir)
    assert [r["status"] for r in records if r["job"] is not None] == ["failed"]  # not "infeasible"
    assert not (sweep_dir / "1").exists()  # stopped at once


@pytest.mark.slow
def test_a_config_error_in_a_candidate_stops_the_study_in_one_line_before_any_trial(script: Path,
                                                                                     tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run(tune_command(script, sweep_dir, "hydra.sweeper.space.stage=[0,2]",
                            "deepspeed.gradient_clipping=choice(1.0,-1.0)"), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dsconf: "), proc.stderr
    assert "deepspeed.gradient_clipping" in proc.stderr and "-1.0" in proc.stderr
    assert not any(p.is_dir() and p.name.isdigit() for p in sweep_dir.iterdir()) if sweep_dir.exists() else True


@pytest.mark.slow
def test_the_step_time_is_the_slowest_ranks(script: Path, tmp_path: Path) -> None:
    """Rank 1 loads its data slowly and the ranks do not all-reduce (neither gradients nor, without clipping, their
    norm), so rank 0 never waits for it: rank 0's own step is fast, and the trial's step time must be rank 1's."""
    sweep_dir = tmp_path / "sweep"
    proc = run(tune_command(script, sweep_dir, "hydra.sweeper.space.stage=[0]", "hydra.sweeper.space.micro_batch=[4]",
                            "hydra.sweeper.top_k=0", "+test.slow_rank=1", "+test.slow_s=1.5",
                            "+test.no_allreduce=true", "deepspeed.gradient_clipping=0"), tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (record,) = trials(sweep_dir)
    fast, slow = record["rank_step_time_s"]
    # rank 0's own step is clearly shorter (on a loaded machine it has been anywhere from 0.3 to 0.8 s of rank 1's 1.5)
    assert slow >= 1.5 and fast < slow - 0.5, record
    assert record["slowest_rank"] == 1 and record["step_time_s"] == slow
    assert record["samples_per_s"] == pytest.approx(GLOBAL_BATCH / slow)


@pytest.mark.slow
@requires("transformers", "the hf extra is not installed")
def test_an_hf_trainer_script_is_tuned_through_its_training_args(tmp_path: Path) -> None:
    """HF's Trainer loads its data by ``training_args.per_device_train_batch_size``: the tuner sets that (and the
    accumulation), dsconf fills DeepSpeed's "auto" batch keys from it, and the global batch stays the Trainer's."""
    sweep_dir = tmp_path / "sweep"
    proc = run([sys.executable, str(EXAMPLES / "hf_trainer.py"), "-m", "hydra/sweeper=dsconf_tune",
                "hydra.sweeper.steps=2", "hydra.sweeper.warmup_steps=1", "hydra.sweeper.top_k=0",
                "hydra.sweeper.space.stage=[2]", "hydra.sweeper.space.offload=[none]",
                "hydra.sweeper.space.micro_batch=[2,4]", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = trials(sweep_dir)
    assert [r["status"] for r in records] == ["ok", "ok"]
    for r in records:
        assert f"training_args.per_device_train_batch_size={r['micro_batch']}" in r["overrides"]
        ds = json.loads((Path(r["job_dir"]) / "ds_config.json").read_text())
        assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
            8, r["micro_batch"], 8 // r["micro_batch"])  # the example's 8 x 1 on one rank, kept
    assert "output_dir: ${hydra:runtime.output_dir}" in (sweep_dir / "best.yaml").read_text()
