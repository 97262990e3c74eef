"""``dsconf diff``, run as users run it: files, run dirs and override lists compared in DeepSpeed's terms, with
DeepSpeed's own parser as the judge of which configs are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

import dsconf


def dsconf_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "dsconf.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def write(path: Path, config: Any) -> str:
    path.write_text(json.dumps(config) if path.suffix == ".json" else config)
    return str(path)


def changed(proc: subprocess.CompletedProcess) -> Dict[str, List[Any]]:
    """key -> [A's value, B's value] from diff's output (None for "(absent)")."""
    out = {}
    for line in proc.stdout.splitlines():
        key, _, values = line.partition(": ")
        a, _, b = values.partition(" -> ")
        out[key] = [None if v == "(absent)" else json.loads(v) for v in (a, b)]
    return out


SHORT = {"train_batch_size": 8}
# The same config as DeepSpeed reads it: every other key spelt out at DeepSpeed's default, in the spellings and
# types DeepSpeed accepts (an alias, a string boolean, a float for an int).
SPELT_OUT = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
             "fp16": {"enabled": "false", "loss_scale": 0}, "bf16": {"enabled": False},
             "zero_optimization": {"stage": 0, "prefetch_bucket_size": 5e7, "overlap_comm": False}}


def test_defaults_spelt_out_are_equal(tmp_path, deepspeed_parse):
    assert deepspeed_parse(SHORT, 1)["state"] == deepspeed_parse(SPELT_OUT, 1)["state"]  # DeepSpeed agrees
    proc = dsconf_cli(tmp_path, "diff", write(tmp_path / "a.json", SHORT), write(tmp_path / "b.json", SPELT_OUT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_file_vs_file(tmp_path, deepspeed_parse):
    other = {**SPELT_OUT, "gradient_clipping": 0.5, "zero_optimization": {"stage": 2},
             "tensorboard": {"enabled": True, "output_path": "runs/"}}
    b = tmp_path / "b.yaml"
    b.write_text("# YAML, as dsconf validate reads it\n" + json.dumps(other))
    proc = dsconf_cli(tmp_path, "diff", write(tmp_path / "a.json", SHORT), str(b))
    assert proc.returncode == 1, proc.stderr
    shown = changed(proc)
    assert list(shown) == sorted(shown)
    parsed_a, parsed_b = (deepspeed_parse(c, 1)["state"] for c in (SHORT, other))
    assert parsed_a["gradient_clipping"] == 1.0 and parsed_b["gradient_clipping"] == 0.5
    assert shown.pop("gradient_clipping") == [1.0, 0.5]
    assert shown.pop("zero_optimization.stage") == [0, 2]
    assert shown.pop("tensorboard.enabled") == [None, True]
    assert shown.pop("tensorboard.output_path") == [None, "runs/"]
    assert shown.pop("tensorboard.job_name") == [None, parsed_b["monitor_config"]["tensorboard"]["job_name"]]
    assert shown == {}  # nothing else: the keys other spells out are DeepSpeed's defaults


def test_run_dir_vs_overrides(tmp_path):
    run = ["zero=stage2", "precision=bf16", "deepspeed.train_micro_batch_size_per_gpu=4"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "ds_config.json").write_text(json.dumps(dsconf.compose(run, world_size=2)))
    now = ["zero=stage3", "precision=bf16", "deepspeed.train_micro_batch_size_per_gpu=4"]
    proc = dsconf_cli(tmp_path, "diff", "run", " ".join(now))
    assert proc.returncode == 1, proc.stderr
    # the run dir's world size (2, from its batch triple) is the one the overrides are composed for
    assert changed(proc) == {"zero_optimization.stage": [2, 3],
                             "zero_optimization.overlap_comm": [False, True]}  # DeepSpeed's default for stage 3
    same = dsconf_cli(tmp_path, "diff", "run", " ".join(run))
    assert same.returncode == 0 and same.stdout == ""
    at_four = dsconf_cli(tmp_path, "diff", "run", " ".join(run), "--world-size", "4")
    assert at_four.returncode == 2 and "train_batch_size" in at_four.stderr  # the run's triple does not fit 4


def test_overrides_vs_overrides(tmp_path):
    base, other = ["deepspeed.train_batch_size=8"], ["deepspeed.train_batch_size=8", "optimizer=lamb",
                                                     "deepspeed.optimizer.params.lr=3e-4"]
    proc = dsconf_cli(tmp_path, "diff", " ".join(base), " ".join(other))
    assert proc.returncode == 1, proc.stderr
    composed_a, composed_b = (_flat(dsconf.compose(o)) for o in (base, other))
    expected = {k: [composed_a.get(k), composed_b.get(k)] for k in {*composed_a, *composed_b}
                if composed_a.get(k) != composed_b.get(k)}
    assert changed(proc) == expected
    assert expected["optimizer.type"] == ["Adam", "Lamb"] and "optimizer.params.max_coeff" in expected


def test_defaults_vs_overrides_without_a_batch_size(tmp_path):
    proc = dsconf_cli(tmp_path, "diff", "", "zero=stage2 precision=bf16")
    assert proc.returncode == 1, proc.stderr
    assert changed(proc) == {"bf16.enabled": [False, True], "zero_optimization.stage": [0, 2]}


def test_batch_keys_left_to_hf_against_overrides_without_a_batch(tmp_path):
    """An HF template's "auto" batch keys are its values; a side that gives no batch key has none (not dsconf's
    derivation marker)."""
    template = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    proc = dsconf_cli(tmp_path, "diff", write(tmp_path / "hf.json", template), "zero=stage2 optimizer=none")
    assert proc.returncode == 1, proc.stderr
    assert changed(proc) == {"train_batch_size": ["auto", None], "train_micro_batch_size_per_gpu": ["auto", None]}


def _flat(value: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict) and item:
            out.update(_flat(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


@pytest.mark.parametrize("a, b, message", [
    ("missing.json", "", "dsconf: missing.json: cannot read: No such file or directory"),
    ("deepspeed.zero_optimization.overlap_com=true", "",
     "dsconf: overrides 'deepspeed.zero_optimization.overlap_com=true': invalid DeepSpeed config: "
     "deepspeed.zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)"),
    ("", "zero=stage9", "dsconf: overrides 'zero=stage9': invalid DeepSpeed config: zero: unknown option 'stage9'"),
    ("empty_dir", "", "dsconf: empty_dir: a directory without ds_config.json (a run's output dir holds one)"),
    ("broken.json", "", "dsconf: broken.json: malformed JSON at line 1"),
    ("invalid.json", "", "dsconf: invalid.json: invalid DeepSpeed config: gradient_clipp1ng: unknown key"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, a, b, message):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "broken.json").write_text('{"train_batch_size": ')
    write(tmp_path / "invalid.json", {"train_batch_size": 8, "gradient_clipp1ng": 1.0})
    proc = dsconf_cli(tmp_path, "diff", a, b)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.startswith(message) and len(proc.stderr.splitlines()) == 1


def test_diff_imports_neither_torch_nor_deepspeed(tmp_path):
    write(tmp_path / "a.json", SHORT)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "dsconf.cli", "diff", "a.json",
                           "zero=stage2 precision=bf16"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    modules = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert {"dsconf.diff", "dsconf.composition", "dsconf.validate_files"} <= modules  # both sides' paths ran
    assert not {m for m in modules if m.split(".")[0] in ("torch", "deepspeed")}
