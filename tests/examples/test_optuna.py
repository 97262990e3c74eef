"""Hydra's Optuna sweeper with ``hydra/launcher=dsconf``: every trial is a distributed job, the objective is rank 0's
return value, two trials run at once, and a trial whose rank fails is recorded as failed while the study goes on.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from optional_packages import requires
from test_train import TRAIN, ok, output, read_json, run_example

pytestmark = requires("optuna", "hydra-optuna-sweeper is not installed")

STUDY = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
         "hydra.launcher.max_parallel_jobs=2", "hydra.sweeper.sampler.seed=0"]

FAILING_APP = """
import atexit, json, os
import optuna
from hydra.core.hydra_config import HydraConfig
import dsconf

# the study the sweeper creates, kept to write its trials' states when the sweep ends (observed, not changed)
studies, create_study, PARENT = [], optuna.create_study, os.getpid()
optuna.create_study = lambda *a, **k: studies.append(create_study(*a, **k)) or studies[-1]
atexit.register(lambda: os.getpid() == PARENT and studies and json.dump(
    [[t.state.name, t.params, t.value] for t in studies[0].trials], open({trials!r}, "w")))

@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def main(cfg):
    x = float(cfg.search.x)
    if HydraConfig.get().job.num == 1 and int(os.environ["RANK"]) == 1:
        raise RuntimeError("rank 1 of trial 1 fails")
    with open(os.path.join(os.environ["DSCONF_JOB_DIR"], f"ranks-{{os.environ['RANK']}}"), "w") as fh:
        fh.write(os.environ["WORLD_SIZE"])
    return (x - 2.0) ** 2

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_an_optuna_study_of_the_example_runs_each_trial_as_a_distributed_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = ok(run_example(*STUDY, "dist.nproc_per_node=2", "train.steps=4",
                          "deepspeed.train_micro_batch_size_per_gpu=4",
                          "deepspeed.optimizer.params.lr=interval(0.0001,0.01)", f"hydra.sweep.dir={sweep}",
                          cwd=tmp_path, script=TRAIN, timeout=900))
    summary = read_json(sweep / "summary.json")
    jobs = summary["jobs"]
    assert len(jobs) == 4 and all(j["status"] == "COMPLETED" for j in jobs), summary
    for job in jobs:
        assert read_json(sweep / str(job["job"]) / "ds_config.json")["train_batch_size"] == 8  # 2 ranks x 4
    losses = {j["job"]: float(j["result"]) for j in jobs}
    results = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {min(losses.values())}" in results, (results, losses)
    assert "Launching 2 jobs with dsconf (at most 2 at once)" in output(proc)


@pytest.mark.slow
def test_a_failed_trial_is_recorded_as_failed_and_the_study_goes_on(tmp_path):
    app = tmp_path / "objective.py"
    app.write_text(textwrap.dedent(FAILING_APP.format(trials=str(tmp_path / "trials.json"))))
    sweep = tmp_path / "sweep"
    proc = run_example(*STUDY, "dist.nproc_per_node=2", "deepspeed.train_micro_batch_size_per_gpu=1",
                       "+search.x=interval(0,4)", "hydra.sweeper.max_failure_rate=0.5", f"hydra.sweep.dir={sweep}",
                       cwd=tmp_path, script=app, timeout=600)
    assert proc.returncode == 0, output(proc)
    trials = json.loads((tmp_path / "trials.json").read_text())
    states = [state for state, _, _ in trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"], trials
    for state, params, value in trials:
        if state == "COMPLETE":
            assert value == pytest.approx((params["+search.x"] - 2.0) ** 2)
    for job in (0, 2, 3):  # every trial that ran, ran on 2 ranks
        assert {(sweep / str(job) / f"ranks-{r}").read_text() for r in (0, 1)} == {"2"}
    summary = json.loads((sweep / "summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]].count("FAILED") == 1
    assert "rank 1 of trial 1 fails" in output(proc)
