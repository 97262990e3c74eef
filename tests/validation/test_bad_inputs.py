"""Bad inputs, one row each: every mistake is a ConfigError whose problem names the full dotted path and says
what would be valid (a close key, the allowed values, the nearest batch sizes, what replaces a removed feature).

A row is (id, overrides or the text of a user's primary YAML config, expected path, expected substrings of the
problem's message + hint). Rows marked xfail(strict=True) state the correct behaviour for a known dsconf bug.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Union

import pytest

import dsconf
from dsconf.errors import ConfigError

MB = "deepspeed.train_micro_batch_size_per_gpu=4"
OLD = "deepspeed_version=0.19.5"
WORLD_SIZE = 2
PRIMARY = "defaults:\n  - dsconf\n  - _self_\n"


def yaml(body: str) -> str:
    """A user's primary config: dsconf's base config, then the body."""
    return PRIMARY + body


def row(id_: str, inputs: Union[Sequence[str], str], path: Optional[str], *expected: str, bug: str = ""):
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(inputs, path, expected, id=id_, marks=marks)


# Known dsconf bugs (see the report): each row below states the correct behaviour.
BUG_DYNAMIC_HINT = ("composition._key_hint resolves the parent with model_at(), which passes {} to dynamic_model(), "
                    "so optimizer/scheduler params (whose model depends on 'type') get no did-you-mean")
BUG_OVERRIDE_TEXT = "hydra_error_to_config_error drops OverrideParseException.override: the bad override is not named"
BUG_YAML_LOCATION = "hydra_error_to_config_error keeps only the first line of a YAML error: file and line are lost"
BUG_OPTIONAL_SECTION = ("an override under an Optional[...] = None section (offload_param on zero=stage3) fails inside "
                        "OmegaConf.update with 'Unexpected type for root: NoneType', reported at path 'overrides'")

ROWS = [
    # --- typos at every level: full dotted path + "did you mean" the close key ---
    row("typo-top-level", ["deepspeed.gradient_clipp1ng=1.0", MB], "deepspeed.gradient_clipp1ng",
        "unknown key", "did you mean 'gradient_clipping'"),
    row("typo-top-level-added", ["+deepspeed.gradient_clipp1ng=1.0", MB], "deepspeed.gradient_clipp1ng",
        "unknown key", "did you mean 'gradient_clipping'"),
    row("typo-zero", ["deepspeed.zero_optimization.overlap_com=true", MB], "deepspeed.zero_optimization.overlap_com",
        "unknown key", "did you mean 'overlap_comm'"),
    row("typo-fp16", ["deepspeed.fp16.initial_scale_pwer=10", MB], "deepspeed.fp16.initial_scale_pwer",
        "did you mean 'initial_scale_power'"),
    row("typo-optimizer-params-typed-preset", ["deepspeed.optimizer.params.lrr=0.1", MB],
        "deepspeed.optimizer.params.lrr", "unknown key", "did you mean 'lr'"),
    row("typo-optimizer-params-added", ["+deepspeed.optimizer.params.lrr=0.1", MB], "deepspeed.optimizer.params.lrr",
        "unknown key", "did you mean 'lr'"),
    row("typo-sgd-preset-params-added", ["optimizer=sgd", "+deepspeed.optimizer.params.lrr=0.1", MB],
        "deepspeed.optimizer.params.lrr", "did you mean 'lr'"),
    row("typo-torch-optimizer-params", ["optimizer=torch", "deepspeed.optimizer.type=RMSprop",
                                        "+deepspeed.optimizer.params.lrr=0.1", MB],
        "deepspeed.optimizer.params.lrr", "torch.optim.RMSprop takes no argument 'lrr'", "did you mean 'lr'"),
    row("typo-scheduler-params", ["scheduler=warmup", "deepspeed.scheduler.params.warmup_num_step=10", MB],
        "deepspeed.scheduler.params.warmup_num_step", "unknown key", "did you mean 'warmup_num_steps'"),
    row("typo-scheduler-params-added", ["scheduler=warmup", "+deepspeed.scheduler.params.warmup_num_step=10", MB],
        "deepspeed.scheduler.params.warmup_num_step", "unknown key", "'warmup_num_steps'"),
    # a group's name misspelt on the command line: the group, with the value given
    row("typo-group", ["precison=bf16", MB], "precison", "unknown key", "did you mean precision=bf16?"),
    row("typo-group-zero", ["zeros=stage2", MB], "zeros", "unknown key", "did you mean zero=stage2?"),
    row("typo-offload", ["zero=stage2_offload", "deepspeed.zero_optimization.offload_optimizer.devic=cpu", MB],
        "deepspeed.zero_optimization.offload_optimizer.devic", "did you mean 'device'"),
    row("typo-offload-param-unset-section", ["zero=stage3", "deepspeed.zero_optimization.offload_param.devic=cpu", MB],
        "deepspeed.zero_optimization.offload_param.devic", "did you mean 'device'"),
    row("typo-activation-checkpointing", ["activation_checkpointing=default",
                                          "deepspeed.activation_checkpointing.partition_activation=true", MB],
        "deepspeed.activation_checkpointing.partition_activation", "did you mean 'partition_activations'"),
    row("typo-sparse-attention-0.19.5", ["sparse_attention=fixed", "deepspeed.sparse_attention.modee=fixed", OLD, MB],
        "deepspeed.sparse_attention.modee", "did you mean 'mode'"),
    row("typo-dist", ["dist.nproc_per_nod=2", MB], "dist.nproc_per_nod", "did you mean 'nproc_per_node'"),
    row("typo-root", ["deepseed.fp16.enabled=true", MB], "deepseed", "unknown key", "did you mean 'deepspeed'"),
    # --- wrong types ---
    row("type-bool", ["deepspeed.fp16.enabled=maybe", MB], "deepspeed.fp16.enabled", "'maybe'",
        "expected true or false"),
    row("type-int", ["deepspeed.zero_optimization.stage=two", MB], "deepspeed.zero_optimization.stage",
        "'two'", "expected an integer"),
    row("type-float", ["deepspeed.gradient_clipping=abc", MB], "deepspeed.gradient_clipping", "'abc'",
        "expected a number"),
    row("type-batch-string", ["deepspeed.train_batch_size=abc"], "deepspeed.train_batch_size",
        "positive integer", "'abc'"),
    row("type-batch-float", ["deepspeed.train_batch_size=32.5"], "deepspeed.train_batch_size",
        "positive integer", "32.5"),
    # --- out of range ---
    row("range-gradient-clipping", ["deepspeed.gradient_clipping=-1", MB], "deepspeed.gradient_clipping",
        "out of range", ">= 0"),
    row("range-zero-stage", ["deepspeed.zero_optimization.stage=5", MB], "deepspeed.zero_optimization.stage",
        "5 is not allowed", "0, 1, 2, 3"),
    row("range-offload-ratio", ["zero=stage2_offload", "deepspeed.zero_optimization.offload_optimizer.ratio=1.5", MB],
        "deepspeed.zero_optimization.offload_optimizer.ratio", "1.5", "<= 1"),
    row("range-communication-dtype", ["deepspeed.communication_data_type=float32", MB],
        "deepspeed.communication_data_type", "'float32' is not allowed", "'fp32'"),
    row("range-loss-scale", ["precision=fp16", "deepspeed.fp16.loss_scale=-1", MB], "deepspeed.fp16.loss_scale",
        "out of range", ">= 0"),
    row("range-steps-per-print", ["deepspeed.steps_per_print=0", MB], "deepspeed.steps_per_print",
        "out of range", ">= 1"),
    row("range-yaml-zero-stage", yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  zero_optimization:\n"
                                      "    stage: 5\n"), "deepspeed.zero_optimization.stage", "0, 1, 2, 3"),
    # --- conflicting precisions ---
    row("precision-fp16-bf16", ["precision=fp16", "deepspeed.bf16.enabled=true", MB], "deepspeed.bf16.enabled",
        "fp16 and bf16 cannot be enabled together", "precision="),
    row("precision-amp-fp16-0.19.5", ["precision=amp", "deepspeed.fp16.enabled=true", OLD, MB],
        "deepspeed.amp.enabled", "fp16 and amp cannot be enabled together"),
    # --- batch: DeepSpeed's rules, reported with the nearest valid values (world size 2) ---
    row("batch-not-divisible", ["deepspeed.train_batch_size=32", "deepspeed.train_micro_batch_size_per_gpu=5"],
        "deepspeed.train_batch_size", "32 != ", "train_batch_size=30 or 40",
        "train_micro_batch_size_per_gpu=4 or 8"),
    row("batch-odd-total", ["deepspeed.train_batch_size=33"], "deepspeed.train_batch_size", "33 != ",
        "train_batch_size=32 or 34"),
    row("batch-gas-only", ["deepspeed.gradient_accumulation_steps=2"], "deepspeed.train_batch_size",
        "deepspeed.train_micro_batch_size_per_gpu", "needs at least one"),
    row("batch-micro-zero", ["deepspeed.train_micro_batch_size_per_gpu=0"], "deepspeed.train_micro_batch_size_per_gpu",
        "must be > 0", "positive integer"),
    row("batch-micro-too-big", ["deepspeed.train_batch_size=32", "deepspeed.train_micro_batch_size_per_gpu=18"],
        "deepspeed.train_batch_size", "32 != ", "train_batch_size=36", "train_micro_batch_size_per_gpu=16"),
    # --- unknown group options ---
    row("group-zero", ["zero=stage5", MB], "zero", "unknown option 'stage5'", "did you mean 'stage3'"),
    row("group-precision", ["precision=fp8", MB], "precision", "unknown option 'fp8'", "bf16", "fp16", "fp32"),
    row("group-optimizer", ["optimizer=adamm", MB], "optimizer", "unknown option 'adamm'", "did you mean 'adam'"),
    row("group-scheduler", ["scheduler=cosine", MB], "scheduler", "unknown option 'cosine'", "'warmup_cosine'"),
    # --- optimizer and scheduler sections ---
    row("optimizer-unknown-type", ["deepspeed.optimizer.type=Adamm", MB], "deepspeed.optimizer.type",
        "unknown optimizer 'Adamm'", "did you mean 'Adam'"),
    row("optimizer-max-grad-norm-torch", ["optimizer=torch", "deepspeed.optimizer.type=SGD",
                                          "+deepspeed.optimizer.params.max_grad_norm=1", MB],
        "deepspeed.optimizer.params.max_grad_norm", "max_grad_norm", "gradient_clipping"),
    row("optimizer-max-grad-norm-adam", ["+deepspeed.optimizer.params.max_grad_norm=1", MB],
        "deepspeed.optimizer.params.max_grad_norm", "gradient_clipping"),
    row("scheduler-required-param", ["scheduler=warmup_decay", MB], "deepspeed.scheduler.params.total_num_steps",
        "required", "deepspeed.scheduler.params.total_num_steps=<value>"),
    # --- malformed input ---
    row("override-syntax", ["deepspeed.fp16.enabled=[", MB], "overrides", "no viable alternative"),
    row("override-syntax-names-override", ["deepspeed.fp16.enabled=[", MB], "overrides", "deepspeed.fp16.enabled=["),
    row("yaml-syntax", yaml("deepspeed:\n  fp16: {enabled: true\n  train_micro_batch_size_per_gpu: 4\n"), None,
        "while parsing a flow mapping"),
    row("yaml-syntax-names-file-and-line", yaml("deepspeed:\n  fp16: {enabled: true\n"
                                                "  train_micro_batch_size_per_gpu: 4\n"), None, "job.yaml", "line 5"),
    row("yaml-unknown-key", yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  gradient_clipp1ng: 1.0\n"),
        "deepspeed.gradient_clipp1ng", "unknown key", "did you mean 'gradient_clipping'"),
    row("yaml-unknown-nested-key", yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  zero_optimization:\n"
                                        "    overlap_com: true\n"),
        "deepspeed.zero_optimization.overlap_com", "did you mean 'overlap_comm'"),
    # --- features DeepSpeed 0.19.8 removed (the installed, default target): say what to use instead ---
    row("removed-amp", ["precision=amp", MB], "deepspeed.amp", "removed in DeepSpeed 0.19.8",
        "precision=fp16", "precision=bf16"),
    row("removed-amp-disabled", ["precision=amp", "deepspeed.amp.enabled=false", MB], "deepspeed.amp",
        "removed in DeepSpeed 0.19.8", "precision=torch_autocast"),
    row("removed-sparse-attention", ["sparse_attention=fixed", MB], "deepspeed.sparse_attention",
        "removed in DeepSpeed 0.19.8", "sparse_attention=none"),
    row("removed-sparse-gradients", ["+deepspeed.sparse_gradients=true", MB], "deepspeed.sparse_gradients",
        "removed in DeepSpeed 0.19.8", "remove it"),
    row("removed-sparse-gradients-false", ["deepspeed.sparse_gradients=false", MB], "deepspeed.sparse_gradients",
        "removed in DeepSpeed 0.19.8"),
    row("removed-onebitadam", ["optimizer=onebitadam", MB], "deepspeed.optimizer.type",
        "OneBitAdam is not built into DeepSpeed 0.19.8", "use Adam, AdamW or Lamb"),
    row("removed-zerooneadam", ["optimizer=zerooneadam", MB], "deepspeed.optimizer.type",
        "ZeroOneAdam is not built into DeepSpeed 0.19.8", "use Adam, AdamW or Lamb"),
    row("removed-onebitlamb", ["optimizer=onebitlamb", MB], "deepspeed.optimizer.type",
        "OneBitLamb is not built into DeepSpeed 0.19.8", "use Adam, AdamW or Lamb"),
]


def compose_input(inputs: Union[Sequence[str], str], tmp_path: Path) -> dict:
    if isinstance(inputs, str):
        (tmp_path / "job.yaml").write_text(inputs)
        return dsconf.compose([], world_size=WORLD_SIZE, config_dir=str(tmp_path), config_name="job")
    return dsconf.compose(list(inputs), world_size=WORLD_SIZE)


def assert_problem(err: ConfigError, path: Optional[str], expected: Sequence[str]) -> None:
    """A problem sits at ``path`` (and nowhere else) and its message + hint hold every expected substring."""
    if path is not None:
        assert err.paths and set(err.paths) == {path}, f"expected a problem at {path!r} only, got {err.paths}: {err}"
        assert path in str(err)
    text = " ".join(f"{p.path} {p.message} {p.hint}" for p in err.problems)
    missing = [s for s in expected if s not in text]
    assert not missing, f"{missing} not in: {text}"


def test_table_is_large_enough():
    assert len(ROWS) >= 35


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("inputs, path, expected", ROWS)
def test_bad_input(inputs, path, expected, tmp_path):
    with pytest.raises(ConfigError) as info:
        compose_input(inputs, tmp_path)
    assert_problem(info.value, path, expected)
    assert isinstance(info.value, ValueError)


# --- several mistakes at once: all reported together ---------------------------------------------------------


def problems_of(overrides: List[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        dsconf.compose(overrides, world_size=WORLD_SIZE)
    return info.value


def test_all_problems_reported_together_structure_rules_and_batch():
    err = problems_of(["precision=fp16", "deepspeed.bf16.enabled=true", "deepspeed.train_batch_size=33",
                       "deepspeed.gradient_clipping=-1"])
    assert {"deepspeed.bf16.enabled", "deepspeed.train_batch_size", "deepspeed.gradient_clipping"} <= set(err.paths)
    assert len(err.problems) >= 3


def test_all_problems_reported_together_rules_and_batch():
    err = problems_of(["precision=fp16", "deepspeed.bf16.enabled=true", "zero=stage2_offload",
                       "deepspeed.zero_optimization.offload_optimizer.ratio=0.5", "deepspeed.train_batch_size=33"])
    assert set(err.paths) == {"deepspeed.bf16.enabled", "deepspeed.zero_optimization.offload_optimizer.ratio",
                              "deepspeed.train_batch_size"}
    text = str(err)
    assert "(3 problems)" in text
    assert "cannot be enabled together" in text and "needs ZeRO stage 3" in text and "try" in text


def test_all_problems_reported_together_structure_and_batch():
    err = problems_of(["+deepspeed.gradient_clipp1ng=1", "deepspeed.gradient_clipping=-1",
                       "deepspeed.zero_optimization.stage=7", "deepspeed.train_batch_size=33"])
    assert set(err.paths) == {"deepspeed.gradient_clipp1ng", "deepspeed.gradient_clipping",
                              "deepspeed.zero_optimization.stage", "deepspeed.train_batch_size"}
    assert len(err.problems) == 4


# --- the command line: exit 2, one short message naming the path, no traceback -----------------------------------


def dsconf_script() -> str:
    script = Path(sys.executable).parent / "dsconf"
    return str(script) if script.exists() else (shutil.which("dsconf") or "dsconf")


CLI_ROWS = [
    pytest.param(["deepspeed.gradient_clipp1ng=1.0", MB], ["deepspeed.gradient_clipp1ng", "gradient_clipping"],
                 id="typo"),
    pytest.param(["zero=stage5", MB], ["zero", "stage5", "stage3"], id="group-option"),
    pytest.param(["deepspeed.train_batch_size=33", "--world-size", "2"],
                 ["deepspeed.train_batch_size", "32 or 34"], id="batch"),
    pytest.param(["deepspeed.fp16.enabled=[", MB], ["no viable alternative"], id="override-syntax"),
    pytest.param(["precision=amp", MB], ["deepspeed.amp", "removed in DeepSpeed 0.19.8", "precision=fp16"],
                 id="removed-amp"),
]


@pytest.mark.parametrize("args, expected", CLI_ROWS)
def test_cli_check_refuses(args, expected, tmp_path):
    proc = subprocess.run([dsconf_script(), "check", *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("dsconf: invalid DeepSpeed config")
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr
