"""The schema: every field documented, DeepSpeed's real defaults, and keys named exactly as DeepSpeed's JSON."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, List

import pytest

from dsconf.schema import (
    ActivationCheckpointingConfig,
    BF16Config,
    DeepSpeedConfig,
    DsconfConfig,
    FP16Config,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZeroOptimizationConfig,
)
from dsconf.schema.introspect import default_of, describe, fields_of
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, TORCH_OPTIMIZER_PARAMS, OptimizerConfig
from dsconf.schema.scheduler import SCHEDULERS, SchedulerConfig
from dsconf.schema.sparse_attention import SPARSITY_MODES

# Models reached only through a value (optimizer/scheduler type, sparsity mode), not through a field's type.
DYNAMIC_MODELS = [OptimizerConfig, SchedulerConfig, *SCHEDULERS.values(), *SPARSITY_MODES.values(),
                  *TORCH_OPTIMIZER_PARAMS.values(), *(s.params for s in DEEPSPEED_OPTIMIZERS.values() if s.params)]


def _models_in(tp: Any) -> List[type]:
    if dataclasses.is_dataclass(tp):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models_in(arg)]


def schema_models() -> List[type]:
    """Every schema dataclass: those reachable from DsconfConfig through field types (declared ones included)."""
    seen: List[type] = []
    stack = [DsconfConfig, *DYNAMIC_MODELS]
    while stack:
        model = stack.pop(0)
        if model in seen:
            continue
        seen.append(model)
        for tp, _ in fields_of(model).values():
            stack.extend(_models_in(tp))
    return seen


MODELS = schema_models()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_has_a_one_line_description(model):
    assert len(MODELS) > 60
    for name, (_, field) in fields_of(model).items():
        text = field.metadata.get("help", "")
        assert text and "\n" not in text and len(text) < 110, f"{model.__name__}.{name}"


def test_describe_shows_type_default_and_help():
    rows = describe("deepspeed.fp16")
    assert rows["initial_scale_power"].startswith("int = 16")
    assert "dynamic" in rows["loss_scale"]


def _pydantic_defaults(model) -> dict:
    return {name: (f.alias or name, f.default) for name, f in model.model_fields.items()}


@pytest.mark.parametrize("ours, theirs_path", [
    (FP16Config, "deepspeed.runtime.precision_config.DeepSpeedFP16Config"),
    (BF16Config, "deepspeed.runtime.precision_config.DeepSpeedBF16Config"),
    (ZeroOptimizationConfig, "deepspeed.runtime.zero.config.DeepSpeedZeroConfig"),
    (OffloadOptimizerConfig, "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig"),
    (OffloadParamConfig, "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig"),
])
def test_defaults_are_deepspeeds(ours, theirs_path):
    """Every key dsconf models in a pydantic section has DeepSpeed's name (or JSON alias) and default."""
    import importlib

    module, _, cls = theirs_path.rpartition(".")
    theirs = getattr(importlib.import_module(module), cls)
    by_json_name = {alias: default for alias, default in _pydantic_defaults(theirs).values()}
    by_json_name.update({name: f.default for name, f in theirs.model_fields.items()})
    for name, (tp, field) in fields_of(ours).items():
        if field.metadata.get("until") or field.metadata.get("legacy") and default_of(field) is None:
            continue  # removed from the installed DeepSpeed / a legacy key, null until written
        if _models_in(tp):
            continue  # a nested section (tests/schema/test_sections.py checks each model, both directions)
        assert name in by_json_name, f"{ours.__name__}.{name} is not a DeepSpeed key"
        want = by_json_name[name]
        want = getattr(want, "value", want)
        got = default_of(field)
        if dataclasses.is_dataclass(got) or want is None and got is None:
            continue
        assert got == want, f"{ours.__name__}.{name}: dsconf default {got!r} != DeepSpeed {want!r}"


def test_reference_defaults_where_the_seeds_are_wrong():
    fp16 = FP16Config()
    assert (fp16.initial_scale_power, fp16.min_loss_scale, fp16.loss_scale) == (16, 1, 0.0)
    ds = DeepSpeedConfig()
    assert ds.gradient_clipping == 1.0 and ds.steps_per_print is None
    assert ZeroOptimizationConfig().overlap_comm is None  # DeepSpeed: true only for stage 3


def test_top_level_defaults_match_deepspeed_constants():
    from deepspeed.runtime import constants as c

    ds = DeepSpeedConfig()
    assert ds.gradient_clipping == c.GRADIENT_CLIPPING_DEFAULT
    assert ds.prescale_gradients == c.PRESCALE_GRADIENTS_DEFAULT
    assert ds.gradient_predivide_factor == c.GRADIENT_PREDIVIDE_FACTOR_DEFAULT
    assert ds.steps_per_print == c.STEPS_PER_PRINT_DEFAULT
    assert ds.wall_clock_breakdown == c.WALL_CLOCK_BREAKDOWN_DEFAULT
    assert ds.dump_state == c.DUMP_STATE_DEFAULT
    assert ds.zero_allow_untested_optimizer == c.ZERO_ALLOW_UNTESTED_OPTIMIZER_DEFAULT
    assert ds.zero_force_ds_cpu_optimizer == c.ZERO_FORCE_DS_CPU_OPTIMIZER_DEFAULT
    assert ds.gradient_allreduce_op == c.GRADIENT_ALLREDUCE_OP_DEFAULT


def test_the_deepspeed_node_and_the_dynamic_fields_are_declared_once():
    """DEEPSPEED_NODE names DsconfConfig's DeepSpeed field; optimizer/scheduler ``params`` declare (model_key/models)
    that their sibling ``type`` picks their model, and every reader finds exactly those."""
    from dsconf.schema.introspect import dynamic_model, model_keys
    from dsconf.schema.root import DEEPSPEED_NODE
    from dsconf.schema.scheduler import WarmupLRParams

    assert fields_of(DsconfConfig)[DEEPSPEED_NODE][0] is DeepSpeedConfig
    assert model_keys() == {"optimizer": "type", "scheduler": "type"}
    assert dynamic_model(SchedulerConfig, "params", {"type": "WarmupLR"}) is WarmupLRParams
    assert dynamic_model(OptimizerConfig, "params", {"type": "SGD"}) is TORCH_OPTIMIZER_PARAMS["SGD"]
    assert dynamic_model(OptimizerConfig, "params", {"type": "adamw"}) is DEEPSPEED_OPTIMIZERS["adamw"].params
    assert dynamic_model(OptimizerConfig, "params", {"type": "RMSprop"}) is None  # free-form: torch's signature


def test_activation_checkpointing_defaults_match_deepspeed():
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT

    assert dataclasses.asdict(ActivationCheckpointingConfig()) == ACT_CHKPT_DEFAULT


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_params_match_deepspeed_signatures(name):
    import inspect

    from deepspeed.runtime import lr_schedules

    signature = inspect.signature(getattr(lr_schedules, name).__init__).parameters
    ours = fields_of(SCHEDULERS[name])
    assert set(ours) == set(signature) - {"self", "optimizer"}
    for key, (_, field) in ours.items():
        want = signature[key].default
        got = default_of(field)
        if want is inspect.Parameter.empty:
            assert got == "???", f"{name}.{key} is required in DeepSpeed"
        else:
            assert got == want, f"{name}.{key}"
