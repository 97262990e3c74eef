"""``dsconf explain`` (and ``describe``, its key listing), run as users run it, held against what composition,
the schema and the rules do."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from deepspeed_oracle import STAGE3_ALIASES

from dsconf.groups import group_options
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import fields_of, unwrap_optional
from dsconf.schema.precision import FP16Config
from dsconf.schema.removed import RemovedSections
from dsconf.validation.rules import RULES


def dsconf(*args: str, cwd: Path = Path(".")) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "dsconf.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


@dataclasses.dataclass
class Explained:
    path: str
    description: str
    rows: Dict[str, str]
    set_by: List[Tuple[str, str]]  # (option, value text)
    rules: List[str]
    keys: List[str]


def explain(*args: str) -> Explained:
    """Run ``dsconf explain`` and split its output into its parts."""
    proc = dsconf("explain", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.rstrip("\n").split("\n")
    out = Explained(lines[0].split()[0], lines[1].strip(), {}, [], [], [])
    label = ""
    for line in lines[2:]:
        if label == "keys":
            out.keys.append(line.split()[0])
        elif line.startswith("    ") and label == "set by":
            option, _, value = line.strip().partition(" -> ")
            out.set_by.append((option.replace(" (default)", ""), value))
        elif line.startswith("    ") and label == "rules":
            if not line.startswith("      "):
                out.rules.append(line.strip().partition(":")[0])
        elif line.startswith("  ") and not line.startswith("   ") and ":" in line:
            label, _, text = line.strip().partition(":")
            out.rows[label] = text.strip()
        else:  # a continuation of the row above
            out.rows[label] += "\n" + line.strip()
    return out


def test_a_leaf_key():
    shown = explain("deepspeed.fp16.loss_scale")
    field = fields_of(FP16Config)["loss_scale"][1]
    assert shown.path == "deepspeed.fp16.loss_scale"
    assert shown.description == field.metadata["help"]
    assert shown.rows["type"] == "float"
    assert json.loads(shown.rows["default"]) == field.default == 0.0
    assert shown.rows["range"] == ">= 0"
    assert shown.rows["aliases"] == "none"
    assert shown.keys == []


def test_allowed_values_and_a_version_gate():
    shown = explain("deepspeed.gradient_allreduce_op", "--deepspeed-version", "0.19.5")
    assert shown.rows["allowed"] == '"mean", "sum" (any case)'
    assert json.loads(shown.rows["default"]) == "mean"
    assert shown.rows["versions"].startswith("DeepSpeed >= 0.19.8; target 0.19.5: refused")
    assert "target 0.19.8: known" in explain("deepspeed.gradient_allreduce_op", "--deepspeed-version",
                                             "0.19.8").rows["versions"]


def test_a_section_lists_its_keys():
    shown = explain("deepspeed.fp16")
    assert shown.rows["type"] == "section (FP16Config)"
    assert shown.keys == [f"deepspeed.fp16.{name}" for name in fields_of(FP16Config)]
    assert ("precision=fp16", '{"enabled": true}') in shown.set_by


def test_describe_is_the_key_listing_of_explain():
    proc = dsconf("describe", "deepspeed.fp16")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == explain("deepspeed.fp16").keys


def test_the_tree_of_sections():
    proc = dsconf("explain")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    top = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert top == ["deepspeed", "dist", "hf"]
    under_deepspeed = {line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("    ")}
    sections = {name for name, (tp, _) in fields_of(DeepSpeedConfig).items()
                if dataclasses.is_dataclass(unwrap_optional(tp)[0])}
    assert {"zero_optimization", "fp16", "tensorboard", "amp", "elasticity"} <= sections
    assert sections | {"optimizer", "scheduler"} <= under_deepspeed
    assert "gradient_clipping" not in under_deepspeed  # a key, not a section
    zero = next(line for line in lines if line.split()[0] == "zero_optimization")
    assert fields_of(DeepSpeedConfig)["zero_optimization"][1].metadata["help"] in zero


def _composed(option: str, path: str):
    from omegaconf import OmegaConf

    from dsconf.composition import compose_config

    return OmegaConf.select(compose_config([option]).deepspeed, path.removeprefix("deepspeed."),
                            throw_on_missing=False)


@pytest.mark.parametrize("key, group, default", [
    ("deepspeed.zero_optimization.offload_optimizer.device", "zero", "none"),
    ("deepspeed.optimizer.params.lr", "optimizer", None),
])
def test_the_group_options_that_set_a_key_are_those_that_change_it(key, group, default):
    """Every option listed composes to the value shown; every other option of the group leaves the key at its
    default (null: not there)."""
    shown = dict(explain(key).set_by)
    assert shown, "no group option listed"
    for option in group_options()[group]:
        value = _composed(f"{group}={option}", key)
        if f"{group}={option}" in shown:
            assert json.loads(shown[f"{group}={option}"].split("  (")[0]) == value, option
        else:
            assert value == default, f"{group}={option} sets {key} to {value!r} but is not listed"
    assert not [option for option in shown if not option.startswith(group + "=")]


def test_the_rules_on_a_key():
    shown = explain("deepspeed.fp16.loss_scale")
    # static loss scaling is refused with Lamb (at initialize) and its dynamic settings checked at parse
    assert set(shown.rules) == {"dynamic_loss_scale_settings", "lamb_needs_dynamic_loss_scale"}
    assert explain("deepspeed.zero_optimization.overlap_comm").rules == []
    stage = set(explain("deepspeed.zero_optimization.stage").rules)
    assert {"amp_without_zero", "param_offload_needs_stage3", "allreduce_sum_not_with_stage3"} <= stage
    assert stage == {r.name for r in RULES if "zero_optimization.stage" in r.keys}


def test_a_removed_section_and_its_advice():
    shown = explain("deepspeed.amp.opt_level")
    advice = fields_of(RemovedSections)["amp"][1].metadata["instead"]
    assert shown.rows["versions"].startswith("DeepSpeed < 0.19.8; target 0.19.8: refused")
    assert advice in shown.rows["versions"]
    assert "target 0.19.5: known" in explain("deepspeed.amp.opt_level", "--deepspeed-version", "0.19.5"
                                             ).rows["versions"]
    assert shown.set_by == [("precision=amp", '"O1"')]


def test_overrides_decide_which_params_exist():
    shown = explain("deepspeed.optimizer.params.freeze_step", "optimizer=onebitadam")
    assert "< 0.19.8" in shown.rows["versions"] and "type=OneBitAdam: removed in 0.19.8" in shown.rows["versions"]
    proc = dsconf("explain", "deepspeed.optimizer.params.freeze_step")  # Adam, the default, has no freeze_step
    assert proc.returncode == 2 and "deepspeed.optimizer.params.freeze_step: unknown key" in proc.stderr


def test_the_scheduler_type_decides_which_params_exist():
    """scheduler.params is dynamic like optimizer.params: its keys are those of the model its sibling type picks,
    whether a group option or a dotted override sets the type."""
    from dsconf.schema.scheduler import WarmupCosineLRParams, WarmupLRParams

    shown = explain("deepspeed.scheduler.params.warmup_num_steps", "scheduler=warmup")
    field = fields_of(WarmupLRParams)["warmup_num_steps"][1]
    assert shown.description == field.metadata["help"]
    assert (shown.rows["type"], json.loads(shown.rows["default"]), shown.rows["range"]) == ("int", 1000, "> 0")
    assert explain("deepspeed.scheduler.params", "deepspeed.scheduler.type=WarmupCosineLR").keys == [
        f"deepspeed.scheduler.params.{name}" for name in fields_of(WarmupCosineLRParams)]
    proc = dsconf("explain", "deepspeed.scheduler.params.warmup_num_step", "scheduler=warmup")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("dsconf: deepspeed.scheduler.params.warmup_num_step: unknown key (did you mean "
                                  "'warmup_num_steps'"), proc.stderr


def test_an_alias():
    """An alias DeepSpeed's pydantic model accepts (the oracle's table) is shown on its key and resolves to it."""
    assert STAGE3_ALIASES["stage3_prefetch_bucket_size"] == "prefetch_bucket_size"
    shown = explain("zero_optimization.prefetch_bucket_size")
    assert shown.path == "deepspeed.zero_optimization.stage3_prefetch_bucket_size"
    assert shown.rows["aliases"] == "prefetch_bucket_size"


def test_every_deepspeed_alias_resolves():
    from dsconf.explain import resolve

    for canonical, alias in STAGE3_ALIASES.items():
        assert resolve(f"deepspeed.zero_optimization.{alias}").path == f"deepspeed.zero_optimization.{canonical}"


def test_deprecated_names_point_both_ways():
    assert explain("deepspeed.communication_data_type").rows["old names"].startswith("deepspeed.fp32_allreduce")
    assert explain("deepspeed.fp32_allreduce").rows["deprecated"] == (
        "translated to deepspeed.communication_data_type with a warning")


@pytest.mark.parametrize("args, message", [
    (["deepspeed.zero_optimization.overlap_com"],
     "dsconf: deepspeed.zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)"),
    (["deepseed.fp16"], "dsconf: deepseed: unknown key (did you mean 'deepspeed' or 'deepspeed_version'?)"),
    (["deepspeed.fp16.enabled.x"], "dsconf: deepspeed.fp16.enabled.x: unknown key (deepspeed.fp16.enabled is a key, "
                                   "not a section)"),
    (["deepspeed.optimizer", "optimizer=lamm"], "dsconf: optimizer: unknown option 'lamm' (did you mean 'lamb'?)"),
])
def test_unknown_key(args, message):
    proc = dsconf("explain", *args)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr == message + "\n"


def test_explain_imports_neither_torch_nor_deepspeed():
    for args in (["explain", "deepspeed.zero_optimization.stage"], ["explain"], ["describe", "deepspeed.fp16"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "dsconf.cli", *args], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        modules = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert "dsconf.explain" in modules  # the output is really import-time's
        assert not {m for m in modules if m.split(".")[0] in ("torch", "deepspeed")}, args
