"""The ``dsconf`` command, run as users run it (the installed console script, from an unrelated directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import dsconf
from dsconf.groups import group_options
from dsconf.schema.introspect import fields_of
from dsconf.schema.zero import ZeroOptimizationConfig

MB = "deepspeed.train_micro_batch_size_per_gpu=4"


def dsconf_script() -> str:
    script = Path(sys.executable).parent / "dsconf"
    found = str(script) if script.exists() else shutil.which("dsconf")
    assert found, "the dsconf console script is not installed"
    return found


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return subprocess.run([dsconf_script(), *args], capture_output=True, text=True, cwd=cwd,
                          env={**env, "DS_ACCELERATOR": "cpu"}, timeout=120)


def test_show_prints_the_composed_json(tmp_path):
    overrides = ["zero=stage2", "precision=bf16", MB]
    proc = run(tmp_path, "show", *overrides, "--world-size", "2")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown == dsconf.compose(overrides, world_size=2)
    assert shown["train_batch_size"] == 8 and shown["zero_optimization"]["stage"] == 2 and shown["bf16"]["enabled"]
    assert "Traceback" not in proc.stderr


def test_show_world_size_changes_the_batch(tmp_path):
    proc = run(tmp_path, "show", MB, "deepspeed.gradient_accumulation_steps=2", "--world-size", "8")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert [shown[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                               "gradient_accumulation_steps")] == [64, 4, 2]


def test_groups_lists_every_group_and_option(tmp_path):
    proc = run(tmp_path, "groups")
    assert proc.returncode == 0, proc.stderr
    listed = {}
    for line in proc.stdout.strip().splitlines():
        group, _, options = line.partition(":")
        listed[group.strip()] = [o.strip() for o in options.split(",")]
    expected = group_options()
    assert set(expected) == {"precision", "zero", "optimizer", "scheduler", "sparse_attention",
                             "activation_checkpointing"}
    assert listed == expected
    assert "stage2_offload" in listed["zero"] and "bf16" in listed["precision"]


def test_describe_lists_keys_with_descriptions(tmp_path):
    proc = run(tmp_path, "describe", "deepspeed.zero_optimization")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.strip().splitlines()}
    overlap = lines["deepspeed.zero_optimization.overlap_comm"]
    assert fields_of(ZeroOptimizationConfig)["overlap_comm"][1].metadata["help"] in overlap
    assert "Overlap gradient reduction" in overlap
    assert set(lines) == {f"deepspeed.zero_optimization.{key}" for key in fields_of(ZeroOptimizationConfig)}


def test_describe_unknown_path_is_a_config_error(tmp_path):
    proc = run(tmp_path, "describe", "deepspeed.zero_optimisation")
    assert proc.returncode == 2
    assert "deepspeed.zero_optimisation" in proc.stderr and "Traceback" not in proc.stderr


def test_check_valid_config_exits_0(tmp_path):
    proc = run(tmp_path, "check", "zero=stage3", "precision=bf16", MB, "--world-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "train_batch_size=8" in proc.stdout and "micro=4" in proc.stdout and "gas=1" in proc.stdout
    assert proc.stderr == ""


def test_check_invalid_config_exits_2(tmp_path):
    proc = run(tmp_path, "check", "precision=fp16", "deepspeed.bf16.enabled=true", "deepspeed.train_batch_size=33",
               "--world-size", "2")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "deepspeed.bf16.enabled" in proc.stderr and "deepspeed.train_batch_size" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_legacy_warnings_go_to_stderr(tmp_path):
    overrides = ["zero=stage2", "deepspeed.zero_optimization.cpu_offload=true", MB]
    proc = run(tmp_path, "show", *overrides, "--world-size", "2")
    assert proc.returncode == 0, proc.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert json.loads(proc.stdout) == dsconf.compose(overrides, world_size=2)  # stdout is pure JSON
    assert "warning" in proc.stderr and "cpu_offload" in proc.stderr and "offload_optimizer" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("version, code", [("0.19.5", 0), ("0.19.8", 2)])
def test_deepspeed_version_option(tmp_path, version, code):
    proc = run(tmp_path, "check", "precision=amp", MB, "--deepspeed-version", version)
    assert proc.returncode == code, proc.stderr
    if code:
        assert "deepspeed.amp" in proc.stderr and "removed in DeepSpeed 0.19.8" in proc.stderr


def test_config_dir_and_name(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "train.yaml").write_text("defaults:\n  - dsconf\n  - override zero: stage2\n  - _self_\n"
                                     "deepspeed:\n  train_micro_batch_size_per_gpu: 2\n  gradient_clipping: 0.5\n")
    proc = run(tmp_path, "show", "--config-dir", str(conf), "--config-name", "train", "--world-size", "4",
               "deepspeed.gradient_accumulation_steps=3")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["train_batch_size"] == 24 and shown["gradient_clipping"] == 0.5
    assert shown["zero_optimization"]["stage"] == 2



@pytest.mark.parametrize("command", ["show", "check"])
def test_a_relative_config_dir_is_relative_to_the_working_directory(tmp_path, command):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "train.yaml").write_text("defaults:\n  - dsconf\n  - override zero: stage2\n  - _self_\n")
    proc = run(tmp_path, command, "--config-dir", "conf", "--config-name", "train", "--world-size", "2", MB)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert ("train_batch_size=8 " in proc.stdout if command == "check"
            else json.loads(proc.stdout)["zero_optimization"]["stage"] == 2)


def test_compose_takes_a_relative_config_dir(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text("defaults:\n  - dsconf\n  - override zero: stage1\n  - _self_\n")
    monkeypatch.chdir(tmp_path)
    ds = dsconf.compose([MB], world_size=1, config_dir="conf", config_name="train")
    assert ds["zero_optimization"]["stage"] == 1

def test_describe_params_of_the_chosen_optimizer():
    import contextlib
    import io

    from dsconf.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["describe", "deepspeed.optimizer.params", "optimizer=lamb"]) == 0
    assert "max_coeff" in out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["describe", "deepspeed.optimizer.params"]) == 0  # the default optimizer, Adam
    assert "adam_w_mode" in out.getvalue() and "max_coeff" not in out.getvalue()


def test_import_refuses_a_broken_file_and_writes_nothing(tmp_path):
    from pathlib import Path

    corpus = Path(__file__).parent / "corpus"
    out = tmp_path / "out.yaml"
    proc = _cli_subprocess("import", str(corpus / "broken_monitor_config_wrapper.json"), "-o", str(out))
    assert proc.returncode == 1 and not out.exists()
    assert "monitor_config: unknown key: DeepSpeed ignores it" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli_subprocess("import", str(tmp_path / "missing.json"), "-o", str(out))
    assert proc.returncode == 2 and not out.exists()


def test_import_then_show_with_a_relative_config_dir(tmp_path):
    import json
    from pathlib import Path

    source = Path(__file__).parents[1] / "examples" / "ds_configs" / "hf_zero3.json"
    proc = _cli_subprocess("import", str(source), "-o", "hf_zero3.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "hf_zero3.yaml").read_text()
    assert "override zero: stage3_offload_optimizer" in text and "keep_auto: true" in text
    shown = _cli_subprocess("show", "--config-dir", ".", "--config-name", "hf_zero3", "--world-size", "8",
                            cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    ds = json.loads(shown.stdout)
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["optimizer"]["params"]["lr"] == "auto" and ds["train_batch_size"] == "auto"


def test_pre_commit_hook_entry():
    import re
    from pathlib import Path

    import yaml

    (hook,) = yaml.safe_load((Path(__file__).parents[1] / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "dsconf-validate" and hook["entry"] == "dsconf validate"
    pattern = re.compile(hook["files"])
    for name in ("ds_config.json", "configs/ds_config_zero3.json", "deepspeed_z2.yaml", "dsconfig.hjson"):
        assert pattern.search(name), name
    for name in ("train.yaml", "package.json", "config.json"):
        assert not pattern.search(name), name


def _cli_subprocess(*args: str, cwd=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "dsconf.cli", *args], capture_output=True, text=True, cwd=cwd)
