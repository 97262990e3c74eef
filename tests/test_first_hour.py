"""A new user's first hour: the findings of trying dsconf as a newcomer would, one section each.

1. ``dsconf show`` of a config without a batch size shows it, with a note; ``check`` and a run still refuse it.
2. The README's headline sweep is valid (tests/test_readme.py runs it as written).
3. Op builds: tests/launch/test_rank_setup.py (the environment's ninja, a line before a build, a stale lock).
4. Every message keeps or adds the way out: Hydra's ``+group=`` and ``--multirun`` advice, ``--world-size`` for
   ``--world_size``, ``dist.nproc_per_node=2`` for torchrun's ``--nproc_per_node 2``.
5. ``validate`` and ``import`` take an HF template alike: one line, then only the problems that remain.
6. A file only DeepSpeed's hjson reads is valid, with a warning naming the line (HF reads it with ``json.load``).
7. ``dsconf diff`` composes override sides from the script's config (``--config-dir``/``--config-name``).
8. DeepSpeed's noise is left out of dsconf's processes: estimate's accelerator line, "built successfully", the
   FutureWarning of DeepSpeed's calls.
9. Every command that reads a file or writes one, fed the same battery of bad inputs: one line, the documented exit
   status, no traceback, nothing written or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import warm_python

from dsconf.cli import main

REPO = Path(__file__).resolve().parents[1]
HF_TEMPLATE = REPO / "examples" / "ds_configs" / "hf_zero3.json"


def dsconf(capsys: pytest.CaptureFixture, *argv: str) -> Tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def script(tmp_path: Path, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``python examples/train.py ARGS`` from a fresh interpreter (a warm one: tests/warm_python.py)."""
    full_env = {**os.environ, "DS_ACCELERATOR": "cpu", **(env or {})}
    return warm_python.run([str(REPO / "examples" / "train.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"],
                           cwd=str(tmp_path), env=full_env, timeout=120)


# ------------------------------------------------------------------------------------ 1. show without a batch
def test_show_prints_a_config_without_a_batch_size_and_says_what_is_missing(capsys):
    code, out, err = dsconf(capsys, "show", "zero=stage2", "precision=bf16")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["zero_optimization"]["stage"] == 2 and shown["bf16"]["enabled"] is True
    assert "train_batch_size" not in shown and "train_micro_batch_size_per_gpu" not in shown
    (note,) = err.strip().splitlines()
    assert note.startswith("dsconf: note: ") and "deepspeed.train_micro_batch_size_per_gpu=" in note
    code, out, err = dsconf(capsys, "show")
    assert code == 0 and "train_batch_size" not in json.loads(out)


def test_check_and_a_run_still_refuse_a_config_without_a_batch_size(capsys, tmp_path):
    code, _, err = dsconf(capsys, "check", "zero=stage2")
    assert code == 2 and "neither it nor deepspeed.train_micro_batch_size_per_gpu is set" in err
    proc = script(tmp_path, "deepspeed.train_micro_batch_size_per_gpu=null")
    assert proc.returncode == 2 and "is set" in proc.stderr and not (tmp_path / "run" / "logs").exists(), proc.stderr


def test_show_with_a_batch_size_prints_the_triple_and_no_note(capsys):
    code, out, err = dsconf(capsys, "show", "deepspeed.train_batch_size=16", "--world-size", "2")
    assert code == 0 and json.loads(out)["train_micro_batch_size_per_gpu"] == 8 and err == ""


# --------------------------------------------------------------------------------------- 2. the headline sweep
def test_the_readme_headline_sweep_is_valid_for_every_job(capsys):
    readme = (REPO / "README.md").read_text()
    headline = next(line for line in readme.splitlines() if line.startswith("python train.py -m "))
    overrides = headline.split("#")[0].split()[3:]
    groups = [o.split("=", 1) for o in overrides]
    jobs = [[]]
    for key, values in groups:
        jobs = [[*job, f"{key}={value}"] for job in jobs for value in values.split(",")]
    assert len(jobs) >= 4
    for job in jobs:
        code, _, err = dsconf(capsys, "check", "--config-dir", str(REPO / "conf"), "--config-name", "config", *job)
        assert code == 0, (job, err)


# ------------------------------------------------------------------------------------------ 4. ways out kept
def test_a_group_the_defaults_list_lacks_keeps_hydras_plus_advice(capsys):
    code, _, err = dsconf(capsys, "show", "--config-dir", str(REPO / "conf"), "--config-name", "config",
                          "experiment=zero2_bf16_warmup")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "+experiment=zero2_bf16_warmup" in err


def test_a_sweep_without_multirun_keeps_hydras_advice(tmp_path):
    proc = script(tmp_path, "zero=stage1,stage2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "add --multirun" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_cfg_with_multirun_is_one_line_with_the_way_out(tmp_path):
    proc = script(tmp_path, "--cfg", "job", "-m", "zero=stage1,stage2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr
    assert "Only one of --run, --multirun, --cfg" in proc.stderr and "without -m" in proc.stderr


def test_an_option_misspelt_with_an_underscore_names_the_right_one(capsys):
    code, _, err = dsconf(capsys, "check", "--world_size", "2")
    assert code == 2 and err.strip() == "dsconf: check: unknown option --world_size (did you mean --world-size?)"
    code, _, err = dsconf(capsys, "validate", str(HF_TEMPLATE), "--keepauto")
    assert code == 2 and "did you mean --keep-auto?" in err


@pytest.mark.parametrize("argv, override", [
    (["--nproc_per_node", "2"], "dist.nproc_per_node=2"),
    (["--nproc-per-node=2"], "dist.nproc_per_node=2"),
    (["--nnodes", "2"], "dist.nnodes=2"),
    (["--master_port", "29500"], "dist.rdzv_endpoint=HOST:PORT"),
])
def test_torchruns_options_on_a_dsconf_app_name_the_override(tmp_path, argv, override):
    proc = script(tmp_path, *argv)
    assert proc.returncode == 2 and override in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr
    assert not (tmp_path / "run").exists()  # nothing composed, nothing started


# ------------------------------------------------------------------------------- 5. HF templates, one way
def test_validate_and_import_take_an_hf_template_alike(capsys, tmp_path):
    code, out, err = dsconf(capsys, "validate", str(HF_TEMPLATE))
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "an HF Trainer/Accelerate template ('auto' in 17 keys)" in lines[0]
    assert "--keep-auto" in lines[0]
    assert lines[1].endswith("OK (world size 1: train_batch_size=auto micro=auto gas=auto)")
    code, out_import, err_import = dsconf(capsys, "import", str(HF_TEMPLATE), "-o", str(tmp_path / "hf.yaml"))
    assert code == 0 and lines[0] in out_import.splitlines(), out_import + err_import


def test_an_hf_template_lists_only_the_problems_that_remain(capsys, tmp_path):
    template = json.loads(HF_TEMPLATE.read_text())
    template["gradient_clipp1ng"] = 1.0
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(template))
    code, out, err = dsconf(capsys, "validate", str(path))
    assert code == 1
    assert "1 problem:" in err and "gradient_clipp1ng" in err and "is set" not in err and "'auto' is filled" not in err
    code, _, err = dsconf(capsys, "validate", "--no-keep-auto", str(HF_TEMPLATE))
    assert code == 1 and "'auto' is filled by HF" in err  # asked for DeepSpeed alone: every "auto" is a problem


# -------------------------------------------------------------------------------------- 6. only hjson reads it
LOOSE = '{\n  "train_micro_batch_size_per_gpu": 8\n  "bf16": {"enabled": true},\n}\n'


def test_a_file_only_deepspeed_reads_is_valid_with_a_warning_naming_the_line(capsys, tmp_path):
    path = tmp_path / "loose.json"
    path.write_text(LOOSE)
    code, out, err = dsconf(capsys, "validate", str(path))
    assert code == 0
    warning = next(line for line in (out + err).splitlines() if "warning" in line)
    assert "not strict JSON at line 3, column 3" in warning and "json.load" in warning
    with pytest.raises(json.JSONDecodeError):  # what HF Trainer and Accelerate do with it
        json.loads(LOOSE)
    code, out, err = dsconf(capsys, "import", str(path), "-o", str(tmp_path / "loose.yaml"))
    assert code == 0 and "not strict JSON at line 3" in err
    code, _, err = dsconf(capsys, "diff", str(path), str(path))
    assert code == 0 and "not strict JSON at line 3" in err
    (tmp_path / "strict.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    code, out, err = dsconf(capsys, "validate", str(tmp_path / "strict.json"))
    assert code == 0 and "warning" not in out + err


# ------------------------------------------------------------------------------------ 7. diff's config dir
def test_diff_composes_overrides_from_the_scripts_config(capsys, tmp_path):
    import dsconf as api

    run = tmp_path / "run1"
    run.mkdir()
    conf = str(REPO / "conf")  # micro batch 8, steps_per_print 10
    ds = api.compose(["zero=stage2"], world_size=1, config_dir=conf, config_name="config")
    (run / "ds_config.json").write_text(json.dumps(ds))
    code, out, err = dsconf(capsys, "diff", "--config-dir", conf, "--config-name", "config", str(run), "zero=stage3")
    assert code == 1, err
    assert out.splitlines() == ["zero_optimization.overlap_comm: false -> true", "zero_optimization.stage: 2 -> 3"]
    code, out, _ = dsconf(capsys, "diff", str(run), "zero=stage3 deepspeed.train_micro_batch_size_per_gpu=8")
    assert "steps_per_print: 10 -> (absent)" in out  # from dsconf's base config, the script's keys differ too
    code, _, err = dsconf(capsys, "diff", "--config-dir", str(tmp_path / "nope"), str(run), "")
    assert code == 2 and "--config-dir" in err and len(err.strip().splitlines()) == 1


# -------------------------------------------------------------------------------------------------- 8. noise
def test_estimate_prints_no_accelerator_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "estimate", "--params", "350m"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "Setting accelerator" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.stdout.startswith("DeepSpeed's estimate of model-state memory")


@pytest.mark.slow
def test_a_two_rank_zero2_run_prints_none_of_deepspeeds_noise(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train.py"), "zero=stage2", "precision=bf16",
                           "scheduler=warmup", "dist.nproc_per_node=2", "train.steps=2",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for noise in ("built successfully", "FutureWarning", "Attempting to get learning rate from scheduler"):
        assert noise not in output, (noise, output)
    assert "[rank0]:training" in output  # what the user needs stays


# ---------------------------------------------------------------------------------------- 9. bad inputs
BAD_FILES: Dict[str, bytes] = {
    "latin1.json": b'{"train_batch_size": 8, "x": "\xe9"}',
    "utf16.json": '{"train_batch_size": 8}'.encode("utf-16"),
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "deep_object.json": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "empty.json": b"",
    "blank.json": b"  \n\t\n",
    "junk.json": bytes(range(256)) * 4,
    "list.json": b"[1, 2]",
    "malformed.json": b'{"train_batch_size": 8,, }',
    "python_tag.yaml": b"a: !!python/object/apply:os.system [ls]\n",
}


def _battery(root: Path) -> List[Tuple[str, List[str], int]]:
    """(case, argv, exit status) for every command that reads a file or writes one, on every bad input."""
    good = root / "good.json"
    good.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    (root / "mine.yaml").write_text("# hand-written\n")
    (root / "a_dir").mkdir()
    cases = []
    for name in [*BAD_FILES, "a_dir", "missing.json"]:
        path = str(root / name)
        cases += [(f"validate {name}", ["validate", path], 2),
                  (f"import {name}", ["import", path, "-o", str(root / "out.yaml")], 2),
                  (f"diff {name} overrides", ["diff", path, "zero=stage2"], 2),
                  (f"diff overrides {name}", ["diff", "", path], 2)]
    cases += [
        ("import -o a directory", ["import", str(good), "-o", str(root / "a_dir")], 2),
        ("import -o in a missing directory", ["import", str(good), "-o", str(root / "missing" / "dir" / "x.yaml")], 2),
        ("import -o an existing file", ["import", str(good), "-o", str(root / "mine.yaml")], 2),
        ("schema -o a directory", ["schema", "-o", str(root / "a_dir")], 2),
        ("schema -o in a missing directory", ["schema", "-o", str(root / "missing" / "s.json")], 2),
        ("report of a file", ["report", str(good)], 2),
        ("report of a missing dir", ["report", str(root / "missing")], 2),
        ("show --config-dir a file", ["show", "--config-dir", str(good)], 2),
        ("check --config-dir a missing dir", ["check", "--config-dir", str(root / "missing")], 2),
    ]
    return cases


def _snapshot(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def test_every_command_answers_bad_input_with_one_line(tmp_path, capsys):
    for name, data in BAD_FILES.items():
        (tmp_path / name).write_bytes(data)
    failures = []
    for case, argv, status in _battery(tmp_path):
        before = _snapshot(tmp_path)
        code, out, err = dsconf(capsys, *argv)
        lines = [line for line in (out + err).splitlines() if line.strip()]
        if code != status or len(lines) != 1 or "Traceback" in out + err or _snapshot(tmp_path) != before:
            failures.append(f"{case}: exit {code}, {len(lines)} lines: {(out + err)[-300:]!r}")
    assert not failures, "\n".join(failures)


def test_bad_input_from_a_fresh_process_is_one_line_too(tmp_path):
    """The console script itself, on the inputs whose errors come from deepest inside (recursion, decoding)."""
    for name in ("deep.json", "utf16.json", "latin1.json"):
        (tmp_path / name).write_bytes(BAD_FILES[name])
        proc = subprocess.run([sys.executable, "-m", "dsconf.cli", "validate", name], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("argv", [["check", "deepspeed.train_batch_size=8"], ["show"],
                                  ["validate", str(HF_TEMPLATE)], ["schema"]])
@pytest.mark.parametrize("version, says", [("abc", "'abc' is not a version"),
                                           ("0.10", "dsconf knows DeepSpeed 0.19.5 to")])
def test_a_deepspeed_version_dsconf_does_not_know_is_one_line_in_every_command(capsys, argv, version, says):
    code, out, err = dsconf(capsys, *argv, "--deepspeed-version", version)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert err.startswith("dsconf: ") and "deepspeed_version" in err and says in err, err
