"""The training script's own command line: composition and config mistakes are dsconf's one-line problems, exit 2,
in a single run and in a ``-m`` sweep (before any job starts); ``--help`` lists each option with its line;
shell completion reaches keys of sections that are still null. Through real scripts, as subprocesses; the runs that
launch nothing (the refusals, ``--help``, a plain Hydra app's task) as forked children of one warm interpreter, which
spare each run torch's import (tests/warm_python.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Sequence

import pytest
import warm_python
from validation.test_bad_inputs import ROWS, WORLD_SIZE

from dsconf.groups import GROUP_HELP, group_options, option_help

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "HYDRA_FULL_ERROR": "",
       "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

DSCONF_APP = """
import json, sys
import dsconf

@dsconf.main(config_path="conf", config_name="job", version_base=None)
def train(cfg):
    print("TASK RAN", flush=True)
    if cfg.train.get("fail"):
        raise KeyError("the task's own error")
    return 0

if __name__ == "__main__":
    train()
"""

PLAIN_HYDRA_APP = """
import hydra
import dsconf

@hydra.main(config_path="conf", config_name="job", version_base=None)
def train(cfg):
    print("TASK RAN", flush=True)
    if cfg.train.get("fail"):
        cfg.train.no_such_key  # an OmegaConf error raised by the task: Hydra's report, not dsconf's
    print(dsconf.to_deepspeed(cfg, world_size=1)["train_batch_size"], flush=True)

if __name__ == "__main__":
    train()
"""

JOB_YAML = "defaults:\n  - dsconf\n  - _self_\ntrain:\n  steps: 1\n"


def make_app(tmp_path: Path, source: str = DSCONF_APP, job_yaml: str = JOB_YAML) -> Path:
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "job.yaml").write_text(job_yaml)
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(source))
    return script


def run(script: Path, *args: str, env: dict = ENV, warm: bool = False) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` in the script's folder; ``warm``: a run that starts no rank and no job, from the warm
    interpreter (the same argv, working dir and environment)."""
    argv = [str(script), *args, f"hydra.run.dir={script.parent / 'run'}", f"hydra.sweep.dir={script.parent / 'sweep'}"]
    if warm:
        return warm_python.run(argv, cwd=str(script.parent), env=env, timeout=180)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=script.parent, env=env,
                          timeout=180)


def assert_dsconf_problem(proc: subprocess.CompletedProcess, path: str, expected: Sequence[str]) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text and "HYDRA_FULL_ERROR" not in text, text
    assert "To append to your config use +" not in text, text
    assert "TASK RAN" not in proc.stdout, text
    assert proc.stderr.startswith("dsconf: ") or "\ndsconf: " in proc.stderr, text
    if path:
        assert path in proc.stderr, text
    missing = [s for s in expected if s not in proc.stderr]
    assert not missing, f"{missing} not in: {text}"


OVERRIDE_ROWS = [r for r in ROWS if not isinstance(r.values[0], str)]
YAML_ROWS = [r for r in ROWS if isinstance(r.values[0], str)]


def world(overrides: Sequence[str]) -> List[str]:
    # the table's batch rows assume WORLD_SIZE ranks; nothing is launched: every row is refused first
    return [*overrides, f"dist.nproc_per_node={WORLD_SIZE}"]


def test_the_table_holds_thirty_override_rows():
    assert len(OVERRIDE_ROWS) >= 30 and YAML_ROWS


@pytest.mark.slow
@pytest.mark.parametrize("inputs, path, expected", OVERRIDE_ROWS)
def test_bad_override_single_run(inputs, path, expected, tmp_path):
    assert_dsconf_problem(run(make_app(tmp_path), *world(inputs), warm=True), path or "", expected)


@pytest.mark.slow
@pytest.mark.parametrize("inputs, path, expected", OVERRIDE_ROWS)
def test_bad_override_in_a_sweep_stops_before_any_job(inputs, path, expected, tmp_path):
    proc = run(make_app(tmp_path), "-m", "train.steps=1,2", *world(inputs), warm=True)
    assert_dsconf_problem(proc, path or "", expected)
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").glob("*/.hydra"))


@pytest.mark.parametrize("inputs, path, expected", YAML_ROWS)
@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_bad_primary_yaml(inputs, path, expected, mode, tmp_path):
    script = make_app(tmp_path, job_yaml=inputs + "train:\n  steps: 1\n")
    proc = run(script, *(["-m", "train.steps=1,2"] if mode == "sweep" else []), *world([]), warm=True)
    assert_dsconf_problem(proc, path or "", [e for e in expected if e != "job.yaml"])


def test_a_sweep_names_each_bad_job_and_runs_none(tmp_path):
    proc = run(make_app(tmp_path), "-m", "zero=stage2,stage5", "deepspeed.train_micro_batch_size_per_gpu=2", warm=True)
    assert_dsconf_problem(proc, "zero", ["job #1 (zero=stage5", "unknown option 'stage5'", "did you mean"])
    assert "job #0" not in proc.stderr


@pytest.mark.slow  # sweeps
def test_a_valid_sweep_still_runs_every_job(tmp_path):
    proc = run(make_app(tmp_path), "-m", "train.steps=1,2", "deepspeed.train_micro_batch_size_per_gpu=2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("TASK RAN") == 2


COUNTING_APP = """
import atexit, os
from hydra._internal.config_loader_impl import ConfigLoaderImpl
import dsconf

composed = []
load_sweep_config = ConfigLoaderImpl.load_sweep_config
def counting(self, master_config, sweep_overrides):
    if os.getpid() == PARENT:  # ranks never compose; only the launcher process counts
        composed.append(list(sweep_overrides))
    return load_sweep_config(self, master_config, sweep_overrides)
ConfigLoaderImpl.load_sweep_config = counting
PARENT = os.getpid()
atexit.register(lambda: os.getpid() == PARENT and print("COMPOSED", len(composed), flush=True))

@dsconf.main(config_path="conf", config_name="job", version_base=None)
def train(cfg):
    print("TASK RAN", flush=True)

if __name__ == "__main__":
    train()
"""


@pytest.mark.parametrize("launcher, compositions", [("dsconf", 2), ("basic", 4)])
@pytest.mark.slow  # sweeps
def test_a_checked_sweep_composes_each_job_once_more_only_for_hydras_launcher(launcher, compositions, tmp_path):
    # checked jobs are not composed again by Hydra's batch check; dsconf's launcher takes the checked configs
    proc = run(make_app(tmp_path, COUNTING_APP), "-m", f"hydra/launcher={launcher}", "train.steps=1,2",
               "deepspeed.train_micro_batch_size_per_gpu=2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("TASK RAN") == 2
    assert f"COMPOSED {compositions}\n" in proc.stdout, proc.stdout


@pytest.mark.slow  # starts a rank
def test_a_tasks_own_error_is_not_reported_as_a_config_mistake(tmp_path):
    proc = run(make_app(tmp_path), "+train.fail=true", "deepspeed.train_micro_batch_size_per_gpu=2")
    assert proc.returncode == 1 and "TASK RAN" in proc.stdout
    assert "the task's own error" in proc.stderr and "invalid DeepSpeed config" not in proc.stderr


@pytest.mark.parametrize("args, path, expected", [
    (["deepspeed.zero_optimization.overlap_com=true"], "deepspeed.zero_optimization.overlap_com", ["'overlap_comm'"]),
    (["precision=bf17"], "precision", ["unknown option 'bf17'", "'bf16'"]),
    (["train.stepz=2"], "train.stepz", ["did you mean 'steps'"]),  # the app's own keys get a hint too
    (["train.stepz=2"], "train.stepz", ["for a new key, add it with '+train.stepz=2'"]),  # or it is a new key
    (["train.lr=0.1"], "train.lr", ["train.lr: not in the composed config (add it with '+train.lr=0.1')"]),
    (["deepspeed.fp16.enabled=tru=e"], "overrides", ["deepspeed.fp16.enabled=tru=e"]),
])
def test_plain_hydra_app_whose_config_lists_dsconf(args, path, expected, tmp_path):
    assert_dsconf_problem(run(make_app(tmp_path, PLAIN_HYDRA_APP), *args, warm=True), path, expected)


def test_plain_hydra_app_task_errors_keep_hydras_report(tmp_path):
    proc = run(make_app(tmp_path, PLAIN_HYDRA_APP), "+train.fail=true", warm=True)  # the task runs in the process
    assert proc.returncode == 1 and "TASK RAN" in proc.stdout
    assert "no_such_key" in proc.stderr and "dsconf:" not in proc.stderr


def test_apps_without_dsconf_keep_hydras_messages(tmp_path):
    script = make_app(tmp_path, PLAIN_HYDRA_APP.replace("import dsconf", ""), job_yaml="train:\n  steps: 1\n")
    proc = run(script, "train.stepz=2", warm=True)
    assert proc.returncode == 1 and "dsconf:" not in proc.stderr
    assert "Could not override 'train.stepz'" in proc.stderr


def test_hydra_full_error_keeps_the_traceback(tmp_path):
    proc = run(make_app(tmp_path), "zero=stage5", env={**ENV, "HYDRA_FULL_ERROR": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_help_lists_every_option_with_its_line(tmp_path):
    proc = run(make_app(tmp_path), "--help", "zero=stage2", warm=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for group, options in group_options().items():
        assert f"{group}: {GROUP_HELP[group]}" in lines
        for option in options:
            line = option_help(group, option)
            rows = [ln.split() for ln in lines if ln.startswith("  ") and ln.strip().endswith(line)]
            assert any(r[0] == option for r in rows), (group, option)
    assert any(ln.split()[:2] == ["stage2", "(chosen)"] for ln in lines)  # the composed choice is marked
    assert any(ln.split()[:2] == ["fp32", "(chosen)"] for ln in lines)


def complete(script: Path, line: str) -> List[str]:
    """Hydra's own bash completion entry point: `-sc query=bash` with the shell's COMP_LINE/COMP_POINT."""
    comp_line = f"python {script.name} {line}"
    env = {**ENV, "COMP_LINE": comp_line, "COMP_POINT": str(len(comp_line))}
    proc = subprocess.run([sys.executable, str(script), "-sc", "query=bash"], capture_output=True, text=True,
                          cwd=script.parent, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow  # seven runs
def test_completion_of_groups_options_and_keys(tmp_path):
    from dsconf.schema.introspect import fields_of, model_at

    script = make_app(tmp_path)
    assert "zero=" in complete(script, "ze")
    assert complete(script, "zero=") == sorted(f"zero={o}" for o in group_options()["zero"])
    assert complete(script, "deepspeed.zero_optimization.overl") == ["deepspeed.zero_optimization.overlap_comm="]
    # a section that is still null in the composed config: its keys come from the schema
    tensorboard = complete(script, "deepspeed.tensorboard.")
    assert tensorboard == sorted(f"deepspeed.tensorboard.{k}=" for k in fields_of(model_at("deepspeed.tensorboard")))
    assert complete(script, "deepspeed.flops_profiler.det") == ["deepspeed.flops_profiler.detailed="]
    assert "deepspeed.zero_optimization.offload_param.device=" in complete(
        script, "deepspeed.zero_optimization.offload_param.")
    assert complete(script, "deepspeed.no_such_section.") == []
