"""The example end to end, through its real command line: ``python examples/train.py ...`` training with DeepSpeed.

On CPU (DeepSpeed's CPU accelerator, gloo): one sweep per world size covers ZeRO stages 0-3 in fp32 and bf16,
checking every job directory and the sweep summary; single runs cover the default command, resuming from a
checkpoint, and the mistakes that must stop before any rank starts. Where DeepSpeed's accelerator trains fp16 (a
GPU, or a CPU whose oneDNN has fp16) the same sweep runs in fp16: tests that depend on it ask the accelerator.
Steps and the model are small: almost all of each job's time is starting DeepSpeed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from accelerator_here import accelerator

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TRAIN = EXAMPLES / "train.py"
STAGES = ["stage0", "stage1", "stage2", "stage3"]
SWEEP_STEPS = 6
PRINT_EVERY = SAVE_EVERY = 3
# every sweep job saves DeepSpeed checkpoints next to its outputs, at steps 3 and 6
CHECKPOINTS = ["train.checkpoint_dir=${hydra:runtime.output_dir}/checkpoints", f"train.save_every={SAVE_EVERY}"]
# what every 2-rank run adds: activation checkpointing through deepspeed.checkpointing, partitioned
TWO_RANKS = ["dist.nproc_per_node=2", "activation_checkpointing=partitioned"]


def run_example(*args: str, cwd: Path, script: Path = TRAIN, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HYDRA_FULL_ERROR")}
    return subprocess.run([sys.executable, str(script), *args], cwd=str(cwd), env=env, text=True,
                          capture_output=True, timeout=timeout)


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{output(proc)[-6000:]}"
    return proc


def read_json(path: Path) -> Dict[str, Any]:
    assert path.is_file(), f"missing {path}"
    return json.loads(path.read_text())


def overrides_of(record: Dict[str, Any]) -> Dict[str, str]:
    return dict(o.split("=", 1) for o in record["overrides"])


def check_job_dir(job_dir: Path, *, world_size: int, steps: int, zero: str, precision: str) -> Dict[str, Any]:
    """ds_config.json and metrics.json exist, agree with each other, with the world size and with the overrides."""
    ds = read_json(job_dir / "ds_config.json")
    metrics = read_json(job_dir / "metrics.json")
    batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert {k: metrics[k] for k in batch} == {k: ds[k] for k in batch}
    micro, accumulation = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    assert ds["train_batch_size"] == micro * accumulation * world_size
    assert metrics["world_size"] == world_size
    assert metrics["zero_stage"] == ds["zero_optimization"]["stage"] == int(zero.removeprefix("stage"))
    assert metrics["dtype"] == precision
    assert bool(ds.get(precision, {}).get("enabled")) or precision == "fp32"
    assert metrics["steps"] == steps
    assert metrics["final_loss"] < metrics["initial_loss"], metrics  # it learned something
    assert metrics["samples_per_second"] and metrics["samples_per_second"] > 0
    # the loss of every step this run trained, averaged over ranks like the printed ones
    assert [s for s, _ in metrics["losses"]] == list(range(metrics["start_step"] + 1, steps + 1))
    assert metrics["losses"][-1][1] == pytest.approx(metrics["final_loss"], abs=1e-4)
    for rank in range(world_size):
        assert (job_dir / "logs" / f"rank{rank}.stdout.log").is_file()
    return metrics


def check_checkpoints(folder: Path, *, world_size: int, zero: str) -> None:
    """A checkpoint of each saved step, ``latest`` naming the last; with ZeRO, each rank's partition in it."""
    assert (folder / "latest").read_text().strip() == f"global_step{SWEEP_STEPS}"
    for step in range(SAVE_EVERY, SWEEP_STEPS + 1, SAVE_EVERY):
        names = [p.name for p in (folder / f"global_step{step}").iterdir()]
        assert any(name.endswith("model_states.pt") for name in names), names
        if zero != "stage0":
            for rank in range(world_size):
                assert any(f"zero_pp_rank_{rank}_" in name for name in names), names


def check_sweep(sweep_dir: Path, proc: subprocess.CompletedProcess, *, world_size: int, steps: int,
                precisions: List[str]) -> Dict[tuple, Dict[str, Any]]:
    """Every job COMPLETED, its directory complete, the summary listing each (zero, precision) once."""
    ok(proc)
    summary = read_json(sweep_dir / "summary.json")
    jobs = summary["jobs"]
    expected = {(z, p) for z in STAGES for p in precisions}
    assert summary["counts"] == {"COMPLETED": len(expected), "FAILED": 0, "SKIPPED": 0}, summary["counts"]
    assert (sweep_dir / "summary.md").is_file()
    table = (sweep_dir / "summary.md").read_text()
    metrics: Dict[tuple, Dict[str, Any]] = {}
    varied = {k for k in ("zero", "precision") if len({overrides_of(j)[k] for j in jobs}) > 1}
    for job in jobs:
        chosen = overrides_of(job)
        key = (chosen["zero"], chosen["precision"])
        assert job["status"] == "COMPLETED", job
        assert Path(job["job_dir"]) == sweep_dir / str(job["job"])
        # the table leaves out the overrides every job shares (one precision: only zero= is shown)
        shown = [o for o in (f"zero={key[0]}", f"precision={key[1]}") if o.split("=")[0] in varied]
        assert f"| {' '.join(shown)} |" in table or f"| {' '.join(reversed(shown))} |" in table, table
        metrics[key] = check_job_dir(Path(job["job_dir"]), world_size=world_size, steps=steps, zero=key[0],
                                     precision=key[1])
        check_checkpoints(Path(job["job_dir"]) / "checkpoints", world_size=world_size, zero=key[0])
        # rank 0's return value: the final loss as a float (what Hydra's Optuna sweeper needs), a summary column
        assert float(job["result"]) == pytest.approx(metrics[key]["final_loss"]), job
        assert job["metrics"]["return"] == pytest.approx(metrics[key]["final_loss"]), job
        assert job["metrics"]["final_loss"] == metrics[key]["final_loss"], job  # from metrics.json
    assert set(metrics) == expected
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == sorted(str(j["job"]) for j in jobs)
    return metrics


def sweep(tmp: Path, *extra: str, precisions: List[str]) -> tuple[Path, subprocess.CompletedProcess]:
    """``python examples/train.py -m zero=stage0,...,stage3 precision=...``: the example's default launcher is dsconf's.

    Two jobs at a time (the launcher's parallel packing): most of a job's time is DeepSpeed starting up.
    """
    sweep_dir = tmp / "sweep"
    proc = run_example("-m", f"zero={','.join(STAGES)}", f"precision={','.join(precisions)}",
                       f"train.steps={SWEEP_STEPS}", f"deepspeed.steps_per_print={PRINT_EVERY}", *CHECKPOINTS,
                       "hydra.launcher.max_parallel_jobs=2", f"hydra.sweep.dir={sweep_dir}", *extra, cwd=tmp,
                       timeout=900)
    return sweep_dir, proc


# ------------------------------------------------------------------------------------------------ CPU
@pytest.fixture(scope="module")
def sweep_one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    # 2 micro-batches per optimizer step: engine.backward/engine.step accumulate, `steps` counts optimizer steps
    return sweep(tmp_path_factory.mktemp("one_rank"), "deepspeed.wall_clock_breakdown=true",
                 "deepspeed.gradient_accumulation_steps=2", precisions=["fp32", "bf16"])


@pytest.fixture(scope="module")
def sweep_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    return sweep(tmp_path_factory.mktemp("two_ranks"), *TWO_RANKS, precisions=["fp32", "bf16"])


@pytest.mark.slow
def test_sweep_one_rank_every_zero_stage_fp32_bf16(sweep_one_rank: tuple) -> None:
    sweep_dir, proc = sweep_one_rank
    metrics = check_sweep(sweep_dir, proc, world_size=1, steps=SWEEP_STEPS, precisions=["fp32", "bf16"])
    assert not any(m["activation_checkpointing"] for m in metrics.values())
    assert all(m["gradient_accumulation_steps"] == 2 and m["train_batch_size"] == 16 for m in metrics.values())
    # the -m alone used the dsconf launcher (the example's default): jobs ran as torch elastic jobs
    assert "Launching 8 jobs with dsconf" in output(proc)


@pytest.mark.slow
def test_sweep_two_ranks_every_zero_stage_fp32_bf16(sweep_two_ranks: tuple) -> None:
    sweep_dir, proc = sweep_two_ranks
    metrics = check_sweep(sweep_dir, proc, world_size=2, steps=SWEEP_STEPS, precisions=["fp32", "bf16"])
    assert all(m["activation_checkpointing"] for m in metrics.values())


@pytest.mark.slow
def test_progress_honours_steps_per_print_and_wall_clock_breakdown(sweep_one_rank: tuple,
                                                                   sweep_two_ranks: tuple) -> None:
    for (sweep_dir, _), breakdown in ((sweep_one_rank, True), (sweep_two_ranks, False)):
        log = (sweep_dir / "0" / "logs" / "rank0.stdout.log").read_text()
        steps = [line.split()[1] for line in log.splitlines() if line.startswith("step ")]
        assert steps == ["1/6", "3/6", "6/6"], log  # the first, every steps_per_print, the last
        later = [line for line in log.splitlines() if line.startswith(("step 3/", "step 6/"))]
        assert all("samples/s" in line and " lr " in line for line in later), log
        assert all(("ms/step: forward" in line) == breakdown for line in later), log
    # only rank 0 reports
    rank1 = (sweep_two_ranks[0] / "0" / "logs" / "rank1.stdout.log").read_text()
    assert not [line for line in rank1.splitlines() if line.startswith("step ")], rank1


@pytest.mark.slow
def test_default_command_trains_in_well_under_a_minute(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = ok(run_example(f"hydra.run.dir={tmp_path}", cwd=tmp_path))
    elapsed = time.monotonic() - start
    metrics = check_job_dir(tmp_path, world_size=1, steps=30, zero="stage0", precision="fp32")
    assert metrics["final_loss"] < metrics["initial_loss"] - 1.0, metrics
    assert elapsed < 60, f"the default run took {elapsed:.0f} s"
    assert "step 30/30" in proc.stdout and "step 20/30" in proc.stdout
    assert f"loss {metrics['initial_loss']:.3f} -> {metrics['final_loss']:.3f}, " in proc.stdout  # still said


@pytest.mark.slow
def test_resume_from_checkpoint_continues_at_the_saved_step(tmp_path: Path, sweep_two_ranks: tuple) -> None:
    """A sweep job saved checkpoints at steps 3 and 6; a run pointed at its step-3 checkpoint resumes there.

    It then reaches step 6 with the same loss as the job that ran uninterrupted: the model, optimizer and
    scheduler states were restored, on 2 ranks with ZeRO-3 (each rank loads its own partition).
    """
    sweep_dir, proc = sweep_two_ranks
    ok(proc)
    job = next(j for j in read_json(sweep_dir / "summary.json")["jobs"]
               if overrides_of(j)["zero"] == "stage3" and overrides_of(j)["precision"] == "bf16")
    job_dir = Path(job["job_dir"])
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(job_dir / "checkpoints", ckpt)
    (ckpt / "latest").write_text(f"global_step{SAVE_EVERY}")  # as if the job had stopped after step 3

    overrides = [o for o in job["overrides"] if not o.startswith("train.checkpoint_dir=")]
    resumed = ok(run_example(*overrides, f"train.checkpoint_dir={ckpt}", f"hydra.run.dir={tmp_path / 'run'}",
                             cwd=tmp_path))
    assert f"resumed from step {SAVE_EVERY}" in resumed.stdout
    assert "note: the DeepSpeed config differs" not in resumed.stdout
    assert read_json(tmp_path / "run" / "ds_config.json") == read_json(job_dir / "ds_config.json")
    metrics = read_json(tmp_path / "run" / "metrics.json")
    uninterrupted = read_json(job_dir / "metrics.json")
    assert (metrics["start_step"], metrics["steps"]) == (SAVE_EVERY, SWEEP_STEPS)
    assert metrics["initial_loss"] < uninterrupted["initial_loss"] - 0.3  # it did not start from scratch
    assert metrics["final_loss"] == pytest.approx(uninterrupted["final_loss"], rel=1e-2)
    assert (ckpt / "latest").read_text().strip() == f"global_step{SWEEP_STEPS}"


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["precision=fp16"], ["deepspeed.fp16.enabled", "does not support fp16"]),
    (["precision=amp"], ["deepspeed.amp"]),  # removed in DeepSpeed 0.19.8; on 0.19.5 it needs a GPU
    (["precision=amp", "deepspeed_version=0.19.5"], ["deepspeed.amp.enabled", "GPU"]),
    (["train.stepz=5"], ["train.stepz"]),
    (["deepspeed.train_batch_size=33", "dist.nproc_per_node=2"], ["deepspeed.train_batch_size", "32"]),
], ids=["fp16", "amp", "amp-0.19.5", "typo", "batch"])
def test_mistakes_stop_before_any_rank_starts(tmp_path: Path, args: List[str], words: List[str]) -> None:
    """fp16 and Apex AMP are mistakes only where the accelerator the ranks would use cannot run them: DeepSpeed's,
    as this environment's DS_ACCELERATOR picks it, is asked (fp16 on a CPU depends on the CPU)."""
    here = accelerator()
    if "does not support fp16" in words and here.fp16:  # fp16 trains here: no mistake, the run trains
        ok(run_example(*args, f"hydra.run.dir={tmp_path}", cwd=tmp_path))
        check_job_dir(tmp_path, world_size=1, steps=30, zero="stage0", precision="fp16")
        return
    gpu_here = here.name == "cuda" and here.devices > 0
    if "GPU" in words and gpu_here:  # a GPU is there: Apex itself is what is missing
        if importlib.util.find_spec("apex") is not None:
            pytest.skip("a CUDA GPU and apex: Apex AMP is allowed here")
        words = [words[0], "apex"]
    proc = run_example(*args, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    text = output(proc)
    assert proc.returncode != 0, text
    assert "Traceback" not in text, text
    for word in words:
        assert word in text, text
    if args[0] == "precision=amp" and len(args) == 1:
        assert ("apex" if gpu_here else "GPU") in text or "removed in DeepSpeed" in text, text
    assert not (tmp_path / "logs").exists(), "ranks were started"
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.slow
def test_warmup_script_loads_deepspeeds_cpu_ops(tmp_path: Path) -> None:
    proc = ok(run_example(script=EXAMPLES / "warmup.py", cwd=tmp_path))
    assert "DeepSpeed is ready" in proc.stdout


PRESETS = sorted(p.stem for p in (EXAMPLES / "conf" / "experiment").glob("*.yaml"))


@pytest.fixture(scope="module")
def example_config_store() -> Iterator[None]:
    """Import examples/train.py as a module, which registers the schema of its own keys (it does not run).

    Afterwards the registration and the example's modules are removed again: later tests send Hydra's
    ConfigStore to spawned ranks, which could not import the example's classes.
    """
    from hydra.core.config_store import ConfigStore

    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("dsconf_example_train", TRAIN)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finally:
        sys.path.remove(str(EXAMPLES))
    yield
    ConfigStore.instance().repo.pop("train_schema.yaml", None)
    for module in ("training", "dsconf_example_train"):
        sys.modules.pop(module, None)


@pytest.mark.parametrize("preset", PRESETS)
def test_experiment_presets_compose_and_validate(preset: str, example_config_store: None) -> None:
    import dsconf

    for world_size in (1, 2):
        ds = dsconf.compose([f"experiment={preset}"], world_size=world_size, config_dir=str(EXAMPLES / "conf"),
                            config_name="train")
        micro, accumulation = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
        assert ds["train_batch_size"] == micro * accumulation * world_size == 32
        assert ds["bf16"]["enabled"] and ds["optimizer"]["type"] == "AdamW"
    if preset == "small_zero2_bf16_warmup":
        assert ds["zero_optimization"]["stage"] == 2 and ds["scheduler"]["type"] == "WarmupLR"
    if preset == "zero3_bf16_two_ranks":
        assert ds["zero_optimization"]["stage"] == 3 and ds["scheduler"]["type"] == "WarmupCosineLR"
        assert ds["scheduler"]["params"]["total_num_steps"] == 60  # ${train.steps}
        assert ds["activation_checkpointing"]["partition_activations"] is True


# ------------------------------------------------------------------------------------------------ GPU
def fp16_ranks() -> int:
    """Ranks for the fp16 runs: up to 2 of the accelerator's devices; a skip where it does not train fp16."""
    here = accelerator()
    if not here.fp16:
        pytest.skip(f"DeepSpeed's {here.name} accelerator here does not train fp16")
    return max(1, min(2, here.devices))


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_sweep_every_zero_stage_fp16(tmp_path: Path) -> None:
    ranks = fp16_ranks()
    sweep_dir, proc = sweep(tmp_path, f"dist.nproc_per_node={ranks}", precisions=["fp16"])
    check_sweep(sweep_dir, proc, world_size=ranks, steps=SWEEP_STEPS, precisions=["fp16"])


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_resume_fp16(tmp_path: Path) -> None:
    ranks = fp16_ranks()
    ckpt = tmp_path / "ckpt"
    common = ["zero=stage2", "precision=fp16", f"dist.nproc_per_node={ranks}", f"train.checkpoint_dir={ckpt}"]
    ok(run_example(*common, "train.steps=3", f"hydra.run.dir={tmp_path / 'first'}", cwd=tmp_path))
    second = ok(run_example(*common, "train.steps=6", f"hydra.run.dir={tmp_path / 'second'}", cwd=tmp_path))
    assert "resumed from step 3" in second.stdout
    metrics = read_json(tmp_path / "second" / "metrics.json")
    assert (metrics["start_step"], metrics["steps"], metrics["dtype"]) == (3, 6, "fp16")
