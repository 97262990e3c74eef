"""Spellings and values DeepSpeed accepts: coerced exactly as DeepSpeed's pydantic models coerce them (checked
against pydantic itself), aliases folded into one canonical spelling, and both spellings at once refused."""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Union

import pytest
from pydantic import TypeAdapter, ValidationError

from dsconf.errors import ConfigError
from dsconf.export import build_deepspeed_dict
from dsconf.validation.normalize import _NOT_COERCED, coerce

VALUES = [True, False, 0, 1, 2, -3, 1.0, 0.0, 1.5, 5e8, 1e12, "1", "0", " 7 ", "1.0", "1.5", "1e3", "true", "False",
          "yes", "off", "t", "n", "abc", "", None, [1, 2], ["1", 2.0], [0.5]]
TYPES = [int, float, bool, str, Optional[int], Optional[bool], List[int], List[float], Union[str, int],
         Union[int, str], Union[float, str]]


@pytest.mark.parametrize("tp", TYPES, ids=str)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_coercion_is_pydantics_lax_mode(tp: Any, value: Any):
    try:
        expected = TypeAdapter(tp).validate_python(value)
    except ValidationError:
        expected = _NOT_COERCED
    got = coerce(value, tp)
    assert got == expected and type(got) is type(expected), (value, tp, got, expected)


def _export(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_deepspeed_dict({"train_batch_size": 8, **config}, world_size=1, target="0.19.8")


def test_coerced_values_are_exported_in_deepspeeds_type(deepspeed_parse):
    ds = _export({"zero_optimization": {"stage": "2", "reduce_bucket_size": 5e8, "overlap_comm": "true"},
                  "fp16": {"enabled": "false", "loss_scale_window": "500"}})
    zero = ds["zero_optimization"]
    assert (zero["stage"], zero["reduce_bucket_size"], zero["overlap_comm"]) == (2, 500000000, True)
    assert ds["fp16"]["enabled"] is False and ds["fp16"]["loss_scale_window"] == 500
    assert deepspeed_parse(ds, 1)["mismatches"] == []


def test_dict_sections_are_not_coerced_because_deepspeed_does_not():
    """flops_profiler is read with dict.get: DeepSpeed would take "false" as a (true) string."""
    with pytest.raises(ConfigError) as info:
        _export({"flops_profiler": {"enabled": "false"}})
    assert info.value.paths == ["deepspeed.flops_profiler.enabled"]


def test_aliases_export_under_one_name(deepspeed_parse):
    ds = _export({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000, "max_live_parameters": 10}})
    zero = ds["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 1000 and zero["stage3_max_live_parameters"] == 10
    assert "prefetch_bucket_size" not in zero and "max_live_parameters" not in zero
    parsed = deepspeed_parse(ds, 1)
    assert parsed["ok"] and parsed["state"]["zero_config"]["prefetch_bucket_size"] == 1000


def test_both_spellings_at_once_are_refused():
    with pytest.raises(ConfigError) as info:
        _export({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})
    assert info.value.paths == ["deepspeed.zero_optimization.prefetch_bucket_size"]
    assert "keep only deepspeed.zero_optimization.stage3_prefetch_bucket_size" in str(info.value)


def test_old_zero_optimization_forms_are_translated(deepspeed_parse):
    for old, stage in ((True, 1), (False, 0)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = build_deepspeed_dict({"train_batch_size": 8, "zero_optimization": old}, world_size=1,
                                      target="0.19.8")
        assert ds["zero_optimization"]["stage"] == stage
        assert len(caught) == 1 and "old form" in str(caught[0].message)
        original = deepspeed_parse({"train_batch_size": 8, "zero_optimization": old}, 1)
        assert original["state"]["zero_config"]["stage"] == stage
