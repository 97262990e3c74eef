"""The tuner's parts that need no trial: settings, the space, the prior's arithmetic, what counts as out of memory,
the Pareto front, the results files; and the command line's refusals (each a real Hydra app, no job started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from launch_helpers import REPO

from dsconf.errors import ConfigError
from dsconf.launch.plots import pareto_front
from dsconf.launch.trial_meter import out_of_memory
from dsconf.tune import space as sp
from dsconf.tune.prior import Prior, Probe, fit
from dsconf.tune.results import Record, read_trials, write_trials
from dsconf.tune.settings import TuneConfig, parse_size, read_settings


def settings(**kwargs):
    return read_settings({"space": {}, **kwargs})


# --------------------------------------------------------------------------------------------- settings
def test_defaults_are_the_structured_configs() -> None:
    s = settings()
    assert (s.steps, s.warmup_steps, s.top_k, s.n_trials) == (TuneConfig.steps, TuneConfig.warmup_steps,
                                                              TuneConfig.top_k, TuneConfig.n_trials)
    assert s.top_k_steps == 3 * s.steps and s.stages == (0, 1, 2, 3) and s.offloads == ("none", "optimizer", "all")
    assert settings(nvme_path="/nvme").offloads == ("none", "optimizer", "all", "optimizer_nvme", "all_nvme")


@pytest.mark.parametrize("text, nbytes", [("24GiB", 24 * 2**30), ("512MiB", 512 * 2**20), ("80GB", 80 * 10**9),
                                          (1000, 1000), ("1.5e9", 1_500_000_000), ("2 gib", 2 * 2**30)])
def test_memory_limit_sizes(text, nbytes) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("kwargs, path, words", [
    ({"steps": 0}, "hydra.sweeper.steps", "must be a whole number >= 1, got 0"),
    ({"warmup_steps": 0}, "hydra.sweeper.warmup_steps", ">= 1"),
    ({"memory_limit": "24 gigs"}, "hydra.sweeper.memory_limit", "cannot read '24 gigs' as a size"),
    ({"memory_limit": -5}, "hydra.sweeper.memory_limit", "at least 1 byte"),
    ({"space": {"stage": [0, 4]}}, "hydra.sweeper.space.stage", "ZeRO stages 0 to 3"),
    ({"space": {"offload": ["gpu"]}}, "hydra.sweeper.space.offload",
     "unknown offload gpu (valid: none, optimizer, all)"),
    ({"space": {"offload": ["all_nvme"]}}, "hydra.sweeper.space.offload", "hydra.sweeper.nvme_path is not set"),
    ({"space": {"micro_batch": [0, 2]}}, "hydra.sweeper.space.micro_batch", "whole numbers >= 1"),
    ({"space": {"stage": 2}}, "hydra.sweeper.space.stage", "must be a list"),
])
def test_bad_settings_name_the_key(kwargs, path, words) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**kwargs)
    assert err.value.paths == [path] and words in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------------ space
def space(*dimensions) -> sp.Space:
    return sp.Space(fixed=("model.hidden=32",), dimensions=tuple(dimensions))


def test_candidates_are_what_deepspeed_runs_with_the_global_batch_kept() -> None:
    cands = sp.candidates(settings(), space(), global_batch=32, world_size=2)
    combos = {(c.stage, c.offload) for c in cands}
    assert combos == {(0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "optimizer"), (2, "optimizer"),
                      (3, "optimizer"), (3, "all")}  # no offload at stage 0; params offloaded at stage 3 only
    assert sorted({c.micro_batch for c in cands}) == [1, 2, 4, 8, 16]  # powers of two dividing 32 / 2
    assert cands[0].key == "stage=0 offload=none micro_batch=16"  # most promising: no offload, largest micro batch
    c = sp.Candidate(2, "optimizer", 4)
    overrides = sp.overrides(c, space(), 32, 2, None)
    assert overrides == ["model.hidden=32", "deepspeed.train_batch_size=32",
                         "deepspeed.train_micro_batch_size_per_gpu=4", "deepspeed.gradient_accumulation_steps=4",
                         "deepspeed.zero_optimization.stage=2",
                         "deepspeed.zero_optimization.offload_optimizer.device=cpu",
                         "deepspeed.zero_optimization.offload_param.device=none"]
    nvme = sp.overrides(sp.Candidate(3, "all_nvme", 1), space(), 32, 2, "/nvme")
    assert "deepspeed.zero_optimization.offload_param.nvme_path=/nvme" in nvme
    assert sp.leanest(cands).key == "stage=3 offload=all micro_batch=1"


def test_user_dimensions_multiply_the_candidates() -> None:
    dim = ("deepspeed.zero_optimization.reduce_bucket_size",
           ("deepspeed.zero_optimization.reduce_bucket_size=5e7", "deepspeed.zero_optimization.reduce_bucket_size=2e8"))
    s = settings(space={"stage": [2], "offload": ["none"], "micro_batch": [1, 2]})
    cands = sp.candidates(s, space(dim), 8, 2)
    assert len(cands) == 4
    assert {c.params()["deepspeed.zero_optimization.reduce_bucket_size"] for c in cands} == set(dim[1])


def test_a_micro_batch_that_would_change_the_global_batch_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        sp.candidates(settings(space={"micro_batch": [3, 4]}), space(), global_batch=16, world_size=2)
    assert err.value.paths == ["hydra.sweeper.space.micro_batch"]
    assert "3 would change the global batch 16" in str(err.value) and "valid: 1, 2, 4, 8" in str(err.value)


def test_a_space_deepspeed_does_not_run_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        sp.candidates(settings(space={"stage": [0], "offload": ["all"]}), space(), 8, 1)
    assert err.value.paths == ["hydra.sweeper.space.offload"]


# ------------------------------------------------------------------------------------------------ prior
def probe(points, cpu_only=False) -> Probe:
    return Probe(stage=3, offload="all", points=points, params=100_000_000, largest_layer_params=10_000_000,
                 total_memory_bytes=80 * 2**30, cpu_only=cpu_only, nproc_per_node=2, nodes=1)


def test_the_fit_through_the_probe() -> None:
    assert fit([(1, 100), (2, 150)]) == (50.0, 50.0)
    assert fit([(1, 100)]) == (100.0, 0.0)
    assert fit([(1, 150), (2, 100)]) == (125.0, 0.0)  # noise, not a batch that needs less: no negative slope


def test_the_prior_adds_deepspeeds_model_states_to_the_probes_measurement() -> None:
    from dsconf.estimate import estimate

    prior = Prior(probe([(1, 2 * 2**30), (2, 3 * 2**30)]), memory_limit=None)
    assert prior.limit == 80 * 2**30 and prior.limit_source == "the accelerator's memory"
    rows = estimate(100_000_000, 10_000_000, gpus_per_node=2, nodes=1)
    stage2 = next(r for r in rows if (r.stage, r.offload_optimizer) == (2, False))
    assert prior.model_states(2, "none") == stage2.per_gpu_bytes  # DeepSpeed's own figure
    single = next(r for r in estimate(100_000_000, 10_000_000) if (r.stage, r.offload_optimizer) == (2, False))
    assert prior.model_states(0, "none") == single.per_gpu_bytes  # unpartitioned: ZeRO-2's estimate on one GPU
    # the probe's own points come back; more micro batch, more memory; less partitioning, more memory
    assert prior.predict(sp.Candidate(3, "all", 2)) == 3 * 2**30
    assert prior.predict(sp.Candidate(3, "all", 4)) == 5 * 2**30
    order = [prior.predict(sp.Candidate(s, "none", 2)) for s in (0, 1, 2, 3)]
    assert order[0] == order[1] > order[2] > order[3] > prior.predict(sp.Candidate(3, "all", 2))
    tight = Prior(probe([(1, 2 * 2**30), (2, 3 * 2**30)]), memory_limit=4 * 2**30)
    assert tight.over(sp.Candidate(3, "all", 2)) is None
    assert tight.over(sp.Candidate(3, "all", 4)) == ("predicted 5.00 GiB per rank > limit 4.00 GiB "
                                                     "(hydra.sweeper.memory_limit)")


def test_on_a_cpu_only_host_the_limit_is_the_ram_per_rank() -> None:
    prior = Prior(probe([(1, 2**30)], cpu_only=True), memory_limit=None)
    assert prior.limit == 40 * 2**30 and prior.limit_source == "the host's RAM / ranks per node"


# -------------------------------------------------------------------------------------- out of memory
def test_what_counts_as_out_of_memory() -> None:
    import torch

    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(MemoryError())
    assert out_of_memory(RuntimeError("CUDA error: out of memory"))
    try:
        torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator's own refusal
    except RuntimeError as err:
        assert out_of_memory(err), err
    try:
        try:
            raise torch.OutOfMemoryError("inner")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("wrapped by a framework") from inner
    except RuntimeError as outer:
        assert out_of_memory(outer)
    assert not out_of_memory(ValueError("stage must be 0..3"))
    assert not out_of_memory(RuntimeError("Expected all tensors to be on the same device"))


def test_the_pareto_front() -> None:
    points = [(1.0, 10.0), (2.0, 30.0), (3.0, 20.0), (4.0, 40.0), (2.0, 5.0)]
    assert pareto_front(points) == [(1.0, 10.0), (2.0, 30.0), (4.0, 40.0)]


def test_trials_json_round_trip(tmp_path: Path) -> None:
    records = [Record("stage=0 offload=none micro_batch=1", ["a=1"], 0, "none", 1, 4, 8, 2, status="pruned",
                      reason="not tried"),
               Record("stage=2 offload=none micro_batch=2", ["a=2"], 2, "none", 2, 2, 8, 2, status="ok",
                      samples_per_s=float("nan"), winner=True)]
    write_trials(records, tmp_path)
    data = json.loads((tmp_path / "trials.json").read_text())
    assert [d["candidate"] for d in data] == ["stage=2 offload=none micro_batch=2",
                                              "stage=0 offload=none micro_batch=1"]
    assert data[0]["samples_per_s"] is None  # strict JSON
    assert [r.candidate for r in read_trials(tmp_path)] == [d["candidate"] for d in data]


# ------------------------------------------------------------------------------- refusals, as users see them
SCRIPT = '''
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    raise SystemExit("a trial ran")


if __name__ == "__main__":
    main()
'''


def refuse(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), "-m", "hydra/sweeper=dsconf_tune",
                           "deepspeed.train_micro_batch_size_per_gpu=2", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                           *args], capture_output=True, text=True, cwd=str(tmp_path), timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("args, line", [
    (["hydra.sweeper.steps=0"], "dsconf: hydra.sweeper.steps: must be a whole number >= 1, got 0\n"),
    (["hydra.sweeper.memory_limit=lots"], "dsconf: hydra.sweeper.memory_limit: cannot read 'lots' as a size "
                                          "(bytes (25769803776) or a number and a unit: 24GiB, 512MiB, 80GB)\n"),
    (["deepspeed.zero_optimization.stage=2"], "dsconf: invalid DeepSpeed config: deepspeed.zero_optimization.stage: "
                                              "is set by the tuner for each trial (search or fix it with "
                                              "hydra.sweeper.space.stage=[...])\n"),
    (["deepspeed.train_micro_batch_size_per_gpu=1,2"], None),
    (["hydra.sweeper.space.micro_batch=[3]"], None),
])
def test_mistakes_are_one_line_and_exit_2_before_any_trial(tmp_path: Path, args: List[str], line) -> None:
    proc = refuse(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dsconf: "), proc.stderr
    if line:
        assert proc.stderr == line
    assert "a trial ran" not in proc.stderr + proc.stdout
    assert not any(p.name.isdigit() for p in (tmp_path / "sweep").glob("*"))
