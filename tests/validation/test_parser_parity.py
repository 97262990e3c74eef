"""dsconf refuses what DeepSpeed's parser refuses, by construction: every check the parser makes (found in
DeepSpeed's code by ``parser_checks``, not listed by hand) is covered by a dsconf rule, a field's declared
constraint, the batch derivation or the hardware check, each shown by a config that trips that very check in
DeepSpeed (its traceback or its message names it) and that dsconf refuses for the same key. A check a DeepSpeed
release adds, rewords or drops fails ``test_every_check_deepspeed_makes_is_accounted_for``; the few checks no
config can reach say why.
"""

from __future__ import annotations

import copy
import math
import os
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Union
from unittest import mock

import pytest
from parser_checks import Check, deepspeed_root, named, parser_checks

from dsconf.batch import BATCH_KEYS
from dsconf.errors import ConfigError
from dsconf.export import build_deepspeed_dict
from dsconf.hardware import Accelerator, hardware_problems
from dsconf.validation.normalize import normalize
from dsconf.validation.rules import RULES

TARGET = "0.19.8"
BATCH = {"train_batch_size": 8}
INF = math.inf


@dataclass(frozen=True)
class Covered:
    """The check is dsconf's too: ``by`` is ``rule:NAME``, ``field:PATH`` (a constraint declared on the key),
    ``batch`` (dsconf.batch) or ``hardware:PATH`` (dsconf.hardware, before launch); ``case`` trips it in both."""

    by: str
    case: Dict[str, Any]


@dataclass(frozen=True)
class Unreachable:
    """No config reaches the check; ``why`` says what stops every config before it."""

    why: str


Coverage = Union[Covered, Unreachable]
CPU = Accelerator("cpu", 0, False)
ZENFLOW = {"stage": 2}


def zenflow(**keys: Any) -> Dict[str, Any]:
    return {**BATCH, "zero_optimization": {**ZENFLOW, "zenflow": keys}}


def fp16(**keys: Any) -> Dict[str, Any]:
    return {**BATCH, "fp16": {"enabled": True, **keys}}


COVERAGE: Dict[str, Coverage] = {
    "autotuning/config.py:_initialize:results_dir cannot be empty":
        Covered("field:autotuning.results_dir", {**BATCH, "autotuning": {"results_dir": ""}}),
    "autotuning/config.py:_initialize:exps_dir cannot be empty":
        Covered("field:autotuning.exps_dir", {**BATCH, "autotuning": {"exps_dir": ""}}),
    "module_inject/auto_ep_presets/base.py:_raise_unsupported_load_balance_coeff:is not supported in this AutoEP "
    "build (would register expert_bias and route through unsupported auxiliary-loss-free load balancing). Set "
    "load_balance_coeff to null or omit the key":
        Covered("rule:no_load_balance_coeff", {**BATCH, "expert_parallel": {"load_balance_coeff": 0.01}}),
    "runtime/config.py:_reject_removed_config_keys:raise":
        Covered("field:amp", {**BATCH, "amp": {"enabled": False}}),
    "runtime/config.py:_reject_removed_config_keys:raise#2":
        Covered("field:zero_optimization.mics_shard_size", {**BATCH, "zero_optimization": {"mics_shard_size": 2}}),
    "runtime/config.py:get_torch_autocast_dtype:Invalid dtype for torch autocast":
        Unreachable("catches KeyError, but DtypeEnum('float64') raises ValueError: DeepSpeed refuses an unknown "
                    "dtype with the enum's own error (dsconf: the choices of torch_autocast.dtype)"),
    "runtime/config.py:get_lower_precision_safe_modules:Invalid module names for torch autocast":
        Covered("field:torch_autocast.lower_precision_safe_modules",
                {**BATCH, "torch_autocast": {"enabled": True, "lower_precision_safe_modules": [1]}}),
    "runtime/config.py:get_communication_data_type:Invalid communication_data_type. Supported data types: "
    "['fp16', 'bf16', 'fp32']. Got":
        Covered("field:communication_data_type", {**BATCH, "communication_data_type": "float32"}),
    "runtime/config.py:get_gradient_allreduce_op:Supported operations":
        Covered("field:gradient_allreduce_op", {**BATCH, "gradient_allreduce_op": "max"}),
    "runtime/config.py:get_checkpoint_tag_validation_mode:Checkpoint config contains invalid tag_validation value of":
        Covered("field:checkpoint.tag_validation", {**BATCH, "checkpoint": {"tag_validation": "maybe"}}),
    "runtime/config.py:get_checkpoint_parallel_write_pipeline:checkpoint::parallel_write::pipeline_stage value of":
        Covered("field:checkpoint.parallel_write.pipeline_stage",
                {**BATCH, "checkpoint": {"parallel_write": {"pipeline_stage": "yes"}}}),
    "runtime/config.py:__init__:Expected a string path to an existing deepspeed config, or a dictionary or a valid "
    "base64. Received":
        Unreachable("refuses a config that is neither a dict nor a file path; dsconf hands DeepSpeed a dict"),
    "runtime/config.py:_initialize_params:bfloat16 and fp16 modes cannot be simultaneously enabled":
        Covered("rule:one_precision", {**BATCH, "fp16": {"enabled": True}, "bf16": {"enabled": True}}),
    "runtime/config.py:_initialize_params:must be \"auto\" or a list of name patterns, got":
        Covered("field:data_types.keep_in_fp32_modules", {**BATCH, "data_types": {"keep_in_fp32_modules": 5}}),
    "runtime/config.py:_batch_assertion:has to be greater than 0":
        Covered("batch", {"train_batch_size": 0, "train_micro_batch_size_per_gpu": 1,
                          "gradient_accumulation_steps": 1}),
    "runtime/config.py:_batch_assertion:Micro batch size per gpu":
        Covered("batch", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0,
                          "gradient_accumulation_steps": 1}),
    "runtime/config.py:_batch_assertion:Gradient accumulation steps":
        Covered("batch", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
                          "gradient_accumulation_steps": 0}),
    "runtime/config.py:_batch_assertion:Check batch related parameters. train_batch_size is not equal to "
    "micro_batch_per_gpu * gradient_acc_step * world_size":
        Covered("batch", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3,
                          "gradient_accumulation_steps": 1}),
    "runtime/config.py:_set_batch_related_parameters:Either train_batch_size or train_micro_batch_size_per_gpu "
    "needs to be provided":
        Covered("batch", {"gradient_accumulation_steps": 1}),
    "runtime/config.py:_do_error_check:DeepSpeedConfig":
        Unreachable("_batch_assertion has already refused a micro batch that is zero or missing"),
    "runtime/config.py:_do_error_check:DeepSpeedConfig#2":
        Unreachable("_batch_assertion has already refused gradient accumulation steps that are zero or missing"),
    "runtime/config.py:_do_error_check:DeepSpeedConfig: Maximum supported ZeRO stage is":
        Unreachable("the ZeRO model's ZeroStageEnum refuses a stage above 3 first (dsconf: the choices of "
                    "zero_optimization.stage)"),
    "runtime/config.py:_do_error_check:='sum' is not supported with ZeRO stage 3":
        Covered("rule:allreduce_sum_not_with_stage3",
                {**BATCH, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}}),
    "runtime/config.py:_do_error_check:='sum' is not supported with ZenFlow":
        Covered("rule:allreduce_sum_not_with_stage3", {**zenflow(), "gradient_allreduce_op": "sum"}),
    "runtime/config.py:_do_error_check:='sum' is not supported with DeepCompile":
        Covered("rule:allreduce_sum_not_with_stage3",
                {**BATCH, "gradient_allreduce_op": "sum", "compile": {"deepcompile": True}}),
    "runtime/config.py:_do_error_check:Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3":
        Covered("rule:master_weights_need_zero", fp16(fp16_master_weights_and_grads=True)),
    "runtime/config.py:_do_error_check:Bf16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3":
        Covered("rule:master_weights_need_zero",
                {**BATCH, "bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}),
    "runtime/config.py:_do_error_check:bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3":
        Covered("rule:master_weights_need_zero", {**BATCH, "bf16": {"enabled": True, "bf16_optimizer_states": True}}),
    "runtime/config.py:_do_error_check:bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled":
        Covered("rule:master_weights_need_zero", {**BATCH, "zero_optimization": {"stage": 1},
                                                  "bf16": {"enabled": True, "bf16_optimizer_states": True}}),
    "runtime/config_utils.py:_process_deprecated_field:raise":
        Unreachable("re-raises a failure to delete a deprecated field from DeepSpeed's own model object"),
    "runtime/config_utils.py:_process_deprecated_field:Cannot provide deprecated parameter":
        Covered("field:zero_optimization.stage3_gather_fp16_weights_on_model_save", {**BATCH, "zero_optimization": {
            "stage": 3, "stage3_gather_fp16_weights_on_model_save": True,
            "stage3_gather_16bit_weights_on_model_save": True}}),
    "runtime/config_utils.py:_process_deprecated_field:raise#2":
        Unreachable("re-raises a failure to set the replacement of a deprecated key, whose value its own field "
                    "has already validated"),
    "runtime/data_pipeline/config.py:get_curriculum_learning:Curriculum learning is enabled":
        Covered("rule:curriculum_learning_needs_metrics",
                {**BATCH, "data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": True}}}}),
    "runtime/data_pipeline/config.py:get_dynamic_batching:Dynamic batching is enabled, so":
        Covered("rule:dynamic_batching_needs_max_tokens",
                {**BATCH, "data_efficiency": {"data_sampling": {"dynamic_batching": {"enabled": True}}}}),
    "runtime/model_checkpointing/config.py:_validate_config_values:contains invalid value":
        Covered("field:checkpoint.writer.type", {**BATCH, "checkpoint": {"writer": {"type": "tape"}}}),
    "runtime/precision_config.py:_validate_loss_scale:fp16.loss_scale must be a number, not bool":
        Covered("field:fp16.loss_scale", fp16(loss_scale=True)),
    "runtime/precision_config.py:_validate_loss_scale:fp16.loss_scale must be a number":
        Covered("field:fp16.loss_scale", fp16(loss_scale="high")),
    "runtime/precision_config.py:_validate_loss_scale:fp16.loss_scale must be a finite number (not inf/-inf/nan)":
        Covered("field:fp16.loss_scale", fp16(loss_scale=INF)),
    "runtime/precision_config.py:_validate_loss_scale:fp16.loss_scale must be >= 0 (0 enables dynamic loss "
    "scaling)":
        Covered("field:fp16.loss_scale", fp16(loss_scale=-1)),
    "runtime/precision_config.py:_reject_non_integer_scale_params:must be an integer, not bool":
        Covered("field:fp16.loss_scale_window", fp16(loss_scale_window=True)),
    "runtime/precision_config.py:_reject_non_integer_scale_params:must be a finite number (not inf/-inf/nan)":
        Covered("field:fp16.min_loss_scale", fp16(min_loss_scale=INF)),
    "runtime/precision_config.py:_reject_non_integer_scale_params:must be an integer":
        Covered("field:fp16.min_loss_scale", fp16(min_loss_scale="one")),
    "runtime/precision_config.py:_validate_dynamic_loss_scale_params:fp16.loss_scale_window must be > 0 when "
    "dynamic loss scaling is enabled (loss_scale=0)":
        Covered("rule:dynamic_loss_scale_settings", fp16(loss_scale_window=0)),
    "runtime/precision_config.py:_validate_dynamic_loss_scale_params:fp16.min_loss_scale must be > 0 when dynamic "
    "loss scaling is enabled (loss_scale=0)":
        Covered("rule:dynamic_loss_scale_settings", fp16(min_loss_scale=0)),
    "runtime/swap_tensor/aio_config.py:get_aio_config:GDS currently only supported for CUDA accelerator":
        Covered("hardware:aio.use_gds", {**BATCH, "aio": {"use_gds": True}}),
    "runtime/zenflow/zenflow_config.py:validate_fields:select_strategy must be one of \"auto\", \"step\", or "
    "\"epoch":
        Covered("field:zero_optimization.zenflow.select_strategy", zenflow(select_strategy="hourly")),
    "runtime/zenflow/zenflow_config.py:validate_fields:If select_interval is a string, it must be \"auto":
        Covered("field:zero_optimization.zenflow.select_interval", zenflow(select_interval="often")),
    "runtime/zenflow/zenflow_config.py:validate_fields:If update_interval is a string, it must be \"auto":
        Covered("field:zero_optimization.zenflow.update_interval", zenflow(update_interval="1")),
    "runtime/zenflow/zenflow_config.py:validate_fields:If update_interval is a number, it must be at least 1":
        Covered("field:zero_optimization.zenflow.update_interval", zenflow(update_interval=0)),
    "runtime/zenflow/zenflow_config.py:validate_fields:full_warm_up_rounds must be an integer":
        Unreachable("the field is typed int: pydantic has made the value an int, or refused it, before this "
                    "validator runs"),
    "runtime/zenflow/zenflow_config.py:validate_fields:pt_reserved_cores_perc must be a float":
        Unreachable("the field is typed float: pydantic has made the value a float, or refused it, before this "
                    "validator runs"),
    "runtime/zero/config.py:compute_grad_norm_valid:compute_grad_norm=false is supported only with ZeRO Stage 1 or 2":
        Covered("rule:compute_grad_norm_needs_stage_1_or_2",
                {**BATCH, "zero_optimization": {"stage": 3, "compute_grad_norm": False}}),
    "runtime/zero/config.py:offload_ratio_check:Partial offloading only supported for ZeRO Stage 3":
        Covered("rule:partial_offload_needs_stage3", {**BATCH, "zero_optimization": {
            "stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}),
    "runtime/zero/leaf_module_config.py:_coerce_container_types:leaf_module configuration must be a mapping of "
    "fields to values":
        Covered("field:zero_optimization.leaf_module", {**BATCH, "zero_optimization": {"stage": 3,
                                                                                        "leaf_module": ["a"]}}),
}


@pytest.fixture(scope="module")
def checks() -> Dict[str, Check]:
    return named(parser_checks())


def test_every_check_deepspeed_makes_is_accounted_for(checks):
    found, listed = set(checks), set(COVERAGE)
    assert found - listed == set(), "DeepSpeed checks dsconf does not cover (give each a Covered or Unreachable)"
    assert listed - found == set(), "listed checks DeepSpeed no longer makes (or whose message changed)"


def test_the_parity_list(checks):
    """The list the issue asks for: each DeepSpeed check and what covers it (printed with -s)."""
    covered = [n for n, c in COVERAGE.items() if isinstance(c, Covered)]
    for name in sorted(COVERAGE):
        entry = COVERAGE[name]
        print(f"{name}\n    -> {entry.by if isinstance(entry, Covered) else 'unreachable: ' + entry.why}")
    assert len(covered) >= 40 and len(checks) == len(COVERAGE)


def test_an_unknown_autocast_dtype_is_refused_by_both():
    case = {**BATCH, "torch_autocast": {"enabled": True, "dtype": "float64"}}
    assert "float64" in deepspeed_refusal(case)[0]
    assert dsconf_paths(case) == ["deepspeed.torch_autocast.dtype"]


def deepspeed_refusal(config: Dict[str, Any]) -> Tuple[str, List[Tuple[str, int]]]:
    """DeepSpeed's refusal of ``config`` on this CPU at world size 1: its text, and the (file, line) of each of
    DeepSpeed's frames it passed through ("" when DeepSpeed accepts the config)."""
    import deepspeed.runtime.config as ds_config

    root = deepspeed_root()
    with mock.patch.object(ds_config.dist, "get_world_size", return_value=1), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        try:
            ds_config.DeepSpeedConfig(copy.deepcopy(config))
        except Exception as err:  # noqa: BLE001 - DeepSpeed raises many types
            frames = [(os.path.relpath(f.filename, root), f.lineno) for f in traceback.extract_tb(err.__traceback__)
                      if f.filename.startswith(root)]
            return f"{type(err).__name__}: {err}", frames
    return "", []


def dsconf_paths(config: Dict[str, Any]) -> List[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            build_deepspeed_dict(config, world_size=1, target=TARGET)
        except ConfigError as err:
            return err.paths
    return []


COVERED = sorted(n for n, c in COVERAGE.items() if isinstance(c, Covered))


@pytest.mark.parametrize("name", COVERED)
def test_deepspeed_refuses_the_case_at_that_check(name, checks):
    check, case = checks[name], COVERAGE[name].case
    error, frames = deepspeed_refusal(case)
    assert error, f"DeepSpeed accepts the case of {name}"
    assert (check.file, check.line) in frames or (check.text and check.text in error), (
        f"DeepSpeed refuses the case elsewhere: {error[:300]} at {frames[-3:]}")


@pytest.mark.parametrize("name", COVERED)
def test_dsconf_refuses_the_case_by_what_covers_it(name):
    entry = COVERAGE[name]
    kind, _, what = entry.by.partition(":")
    if kind == "hardware":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = build_deepspeed_dict(entry.case, world_size=1, target=TARGET)
        assert f"deepspeed.{what}" in [p.path for p in hardware_problems(exported, accelerator=CPU)]
        return
    paths = dsconf_paths(entry.case)
    assert paths, f"dsconf accepts the case of {name}"
    if kind == "rule":
        rule = next(r for r in RULES if r.name == what)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            normalized = normalize(copy.deepcopy(entry.case), _root_model(), "deepspeed", keep_auto=False,
                                   problems=[])
        wanted = {p.path for p in rule.check(normalized)}
        assert wanted and wanted <= set(paths), (wanted, paths)
    elif kind == "field":
        assert any(p == f"deepspeed.{what}" or p.startswith(f"deepspeed.{what}.") for p in paths), paths
    else:
        assert kind == "batch" and any(p.startswith("deepspeed.") and p.split(".")[1] in BATCH_KEYS for p in paths), \
            paths


def _root_model() -> type:
    from dsconf.schema import DeepSpeedConfig

    return DeepSpeedConfig




@pytest.mark.parametrize("name", sorted(n for n, c in COVERAGE.items() if isinstance(c, Unreachable)))
def test_an_unreachable_check_says_why(name):
    assert len(COVERAGE[name].why) > 30
