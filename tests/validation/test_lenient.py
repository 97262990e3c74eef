"""Lenient exactly where DeepSpeed is: plain numbers in keys DeepSpeed reads from the dict, "auto" in its pydantic
sections, settings beside an offload device "none", and ``data_parallel_size`` (read by ``deepspeed.initialize``).

Each accepted form is held against DeepSpeed's reading of the user's own input: DeepSpeed parses it, and what it
parses equals what it parses from dsconf's export. The cases are generated from the schema (every dict-parsed
integer and boolean key, every pydantic key DeepSpeed drops "auto" in), so a new key is covered as it is declared.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, Iterator, List, NamedTuple, Tuple

import pytest

import dsconf
from dsconf.errors import ConfigError, ConfigWarning
from dsconf.export import build_deepspeed_dict
from dsconf.schema import DeepSpeedConfig
from dsconf.schema.introspect import default_of, fields_of, model_key, unwrap_optional
from dsconf.validation.normalize import AutoDroppedWarning, auto_source, deepspeed_auto
from dsconf.validation.rules import RuleWarning
from dsconf.versions import known_in

TARGET = "0.19.8"
BASE = {"train_batch_size": 8}


class Leaf(NamedTuple):
    path: str  # dotted, under the deepspeed node
    field: dataclasses.Field
    type: Any  # the value's type (None removed)
    pydantic: bool  # DeepSpeed parses its section with a pydantic model


def leaves(cls: type = DeepSpeedConfig, path: str = "", pydantic: bool = False) -> Iterator[Leaf]:
    """Every scalar key of the schema that exists in the target version, with its section's parser."""
    for name, (tp, field) in fields_of(cls).items():
        meta = field.metadata
        if not known_in(TARGET, meta.get("since"), meta.get("until")) or meta.get("legacy") or model_key(field):
            continue
        inner, _ = unwrap_optional(tp)
        sub = f"{path}.{name}" if path else name
        if dataclasses.is_dataclass(inner):
            yield from leaves(inner, sub, bool(getattr(inner, "deepspeed_model", None)))
        else:
            yield Leaf(sub, field, inner, pydantic)


# What a key needs beside it for DeepSpeed to read it (or to run at all when it is on), by key or section.
SAMPLING = "data_efficiency.data_sampling"
NEEDS = {
    "data_parallel_size": {"sequence_parallel_size": 1},
    f"{SAMPLING}.curriculum_learning": {"data_efficiency": {"data_sampling": {"curriculum_learning": {
        "curriculum_metrics": {}}}}},
    f"{SAMPLING}.dynamic_batching": {"data_efficiency": {"data_sampling": {"dynamic_batching": {"max_tokens": 1024}}}},
    # an offload block whose device is "none" is no offload: DeepSpeed's parse of it is not dsconf's (none exported)
    "zero_optimization.offload_param": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
    "zero_optimization.offload_optimizer": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
}
# Keys whose parse depends on the machine: DeepSpeed's parser asserts GDS only on its CUDA accelerator.
HARDWARE = {"aio.use_gds"}


def merged(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def nested(path: str, value: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = value
    for part in reversed(path.split(".")):
        out = {part: out}
    context = [need for key, need in NEEDS.items() if path == key or path.startswith(key + ".")]
    return merged(context[0], out) if context else out


def at(config: Dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        config = config[part]
    return config


def export(config: Dict[str, Any]) -> Tuple[Dict[str, Any], List[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        return build_deepspeed_dict({**BASE, **config}, world_size=1, target=TARGET), caught


def valid_int(field: dataclasses.Field) -> int:
    """An integer the field's own constraints allow (its default where that is one)."""
    meta, default = field.metadata, default_of(field)
    choices = [c for c in meta.get("choices") or () if type(c) is int]
    if choices:
        return choices[-1]
    if type(default) is int and default >= meta.get("ge", default) and default > meta.get("gt", default - 1):
        return default
    return int(meta.get("ge", meta.get("gt", 0) + 1))


DICT_INTS = [leaf for leaf in leaves() if not leaf.pydantic and leaf.type is int]
DICT_BOOLS = [leaf for leaf in leaves() if not leaf.pydantic and leaf.type is bool]
IDS = lambda leaf: leaf.path  # noqa: E731


def test_the_generated_cases_cover_the_keys_the_issue_names():
    ints, bools = {leaf.path for leaf in DICT_INTS}, {leaf.path for leaf in DICT_BOOLS}
    assert {"steps_per_print", "activation_checkpointing.number_checkpoints"} <= ints
    assert {"zero_allow_untested_optimizer", "wall_clock_breakdown", "flops_profiler.enabled"} <= bools
    assert len(ints) >= 20 and len(bools) >= 30


# --- 1. plain numbers in keys DeepSpeed reads from the dict ---------------------------------------------------------
@pytest.mark.parametrize("leaf", DICT_INTS, ids=IDS)
def test_an_integral_float_is_the_integer_deepspeed_reads(leaf, deepspeed_parse):
    path, value = leaf.path, valid_int(leaf.field)
    user = nested(path, float(value))
    ds, caught = export(user)
    assert at(ds, path) == value and type(at(ds, path)) is int
    assert not [w for w in caught if issubclass(w.category, ConfigWarning) and path in str(w.message)]
    theirs, ours = deepspeed_parse({**BASE, **user}, 1), deepspeed_parse(ds, 1)
    assert theirs["ok"], theirs["error"]
    assert ours["state"] == theirs["state"]


@pytest.mark.parametrize("leaf", DICT_BOOLS, ids=IDS)
def test_zero_and_one_are_the_booleans_deepspeed_reads(leaf, deepspeed_parse):
    path = leaf.path
    for number in (0, 1):
        user = nested(path, number)
        ds, _ = export(user)
        assert at(ds, path) is bool(number)
        if path not in HARDWARE:
            theirs = deepspeed_parse({**BASE, **user}, 1)
            assert theirs["ok"], theirs["error"]


@pytest.mark.parametrize("path, value, says", [
    ("steps_per_print", 1.5, "expected an integer, got 1.5"),
    ("steps_per_print", "100", "expected an integer"),
    ("activation_checkpointing.number_checkpoints", 2.5, "expected an integer"),
    ("zero_allow_untested_optimizer", 2, "expected true or false, got 2"),
    ("zero_allow_untested_optimizer", 1.0, "expected true or false"),
    ("wall_clock_breakdown", "1", "expected true or false"),
    ("flops_profiler.enabled", "false", "expected true or false"),
])
def test_numbers_that_mean_something_else_stay_errors(path, value, says):
    with pytest.raises(ConfigError) as info:
        export(nested(path, value))
    assert info.value.paths == [f"deepspeed.{path}"] and says in str(info.value)


def test_the_issues_examples_through_validate(tmp_path):
    from dsconf.validate_files import check_config

    report = check_config({**BASE, "steps_per_print": 1e5, "zero_allow_untested_optimizer": 1,
                           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}})
    assert report.ok, report.problems
    assert report.exported["steps_per_print"] == 100000 and report.exported["zero_allow_untested_optimizer"] is True


# --- 2. "auto" in a key DeepSpeed parses with pydantic ---------------------------------------------------------------
DROPPED_AUTO = [leaf for leaf in leaves() if leaf.pydantic and auto_source(leaf.field) is None
                and not deepspeed_auto(leaf.field) and leaf.field.default is not dataclasses.MISSING]


def test_every_pydantic_section_has_auto_cases():
    sections = {leaf.path.rpartition(".")[0] for leaf in DROPPED_AUTO}
    assert {"zero_optimization", "zero_optimization.offload_param", "fp16", "bf16", "tensorboard",
            "comms_logger"} <= sections
    assert len(DROPPED_AUTO) >= 60


@pytest.mark.parametrize("leaf", DROPPED_AUTO, ids=IDS)
def test_auto_is_dropped_for_deepspeeds_default_with_a_warning(leaf, deepspeed_parse):
    path = leaf.path
    user = nested(path, "auto")
    ds, caught = export(user)
    said = [str(w.message) for w in caught if issubclass(w.category, AutoDroppedWarning)]
    assert len(said) == 1 and f"deepspeed.{path}='auto'" in said[0] and "its default" in said[0], said
    theirs, ours = deepspeed_parse({**BASE, **user}, 1), deepspeed_parse(ds, 1)
    assert theirs["ok"], theirs["error"]  # DeepSpeed itself runs it: it drops "auto"
    assert ours["state"] == theirs["state"]  # and dsconf's export means exactly that


def test_the_issues_example_buffer_size(tmp_path):
    from dsconf.validate_files import check_config

    report = check_config({**BASE, "zero_optimization": {"stage": 3, "offload_param": {
        "device": "cpu", "buffer_size": "auto"}}})
    assert report.ok, report.problems
    assert report.exported["zero_optimization"]["offload_param"]["buffer_size"] == 100_000_000
    assert any("buffer_size='auto'" in w and "100000000" in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("path", ["steps_per_print", "activation_checkpointing.number_checkpoints",
                                  "flops_profiler.profile_step", "wall_clock_breakdown"])
def test_auto_in_a_dict_parsed_key_stays_an_error(path):
    with pytest.raises(ConfigError) as info:
        export(nested(path, "auto"))
    assert info.value.paths == [f"deepspeed.{path}"]
    assert "DeepSpeed would get the string 'auto'" in str(info.value)


# --- 3. settings beside an offload device "none" ----------------------------------------------------------------------
@pytest.mark.parametrize("block, setting", [("offload_param", {"nvme_path": "/local_nvme"}),
                                            ("offload_optimizer", {"buffer_count": 8, "pin_memory": False})])
def test_settings_beside_device_none_are_a_warning(block, setting, deepspeed_parse):
    user = {"zero_optimization": {"stage": 3, block: {"device": "none", **setting}}}
    ds, caught = export(user)
    said = [str(w.message) for w in caught if issubclass(w.category, RuleWarning)]
    assert len(said) == 1 and f"deepspeed.zero_optimization.{block}." in said[0] and "no effect" in said[0]
    assert block not in ds["zero_optimization"]  # no offload, as the user chose
    assert deepspeed_parse({**BASE, **user}, 1)["ok"]


def test_a_sweep_over_the_offload_device_composes_on_both_sides():
    common = ["zero=stage3", "deepspeed.train_micro_batch_size_per_gpu=2",
              "deepspeed.zero_optimization.offload_param.nvme_path=/local_nvme"]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        none = dsconf.compose([*common, "deepspeed.zero_optimization.offload_param.device=none"], world_size=1)
        nvme = dsconf.compose([*common, "deepspeed.zero_optimization.offload_param.device=nvme"], world_size=1)
    assert "offload_param" not in none["zero_optimization"]
    assert nvme["zero_optimization"]["offload_param"]["nvme_path"] == "/local_nvme"


def test_offload_below_the_stage_that_honours_it_stays_an_error():
    with pytest.raises(ConfigError) as info:
        export({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    assert info.value.paths == ["deepspeed.zero_optimization.offload_param"]


# --- 4. data_parallel_size, read by deepspeed.initialize ------------------------------------------------------------
def test_data_parallel_size_with_sequence_parallel_size_is_the_mesh():
    ds = build_deepspeed_dict({"train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2,
                               "data_parallel_size": 2}, world_size=2, target=TARGET)
    assert ds["data_parallel_size"] == 2 and ds["train_batch_size"] == 4  # 2 per rank x 2 data-parallel ranks
    with pytest.raises(ConfigError) as info:
        dsconf.compose(["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.sequence_parallel_size=2",
                        "+deepspeed.data_parallel_size=4"], world_size=4)
    assert info.value.paths == ["deepspeed.data_parallel_size"]
    assert "4 x sequence_parallel_size 2 = 8 ranks, but the job has 4" in str(info.value)
    assert "set it to 2" in str(info.value)


def test_data_parallel_size_alone_is_refused_because_deepspeed_ignores_it():
    with pytest.raises(ConfigError) as info:
        export({"data_parallel_size": 1})
    assert info.value.paths == ["deepspeed.data_parallel_size"]
    assert "without sequence_parallel_size" in str(info.value)
