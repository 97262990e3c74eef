"""Legacy DeepSpeed keys: translated to their modern form with exactly one LegacyKeyWarning each, refused when
given together with their replacement, and exported so that DeepSpeed parses the translated values.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

import pytest

import dsconf
from dsconf.errors import ConfigError
from dsconf.validation import LegacyKeyWarning

MB = "deepspeed.train_micro_batch_size_per_gpu=4"
WORLD_SIZE = 2


def primary(body: str, *overrides: str) -> str:
    """A user's primary config: dsconf's base config, group overrides, then ``body``."""
    lines = ["defaults:", "  - dsconf", *(f"  - override {o}" for o in overrides), "  - _self_"]
    return "\n".join(lines) + "\n" + body


def compose_warned(overrides: List[str] = (), yaml: Optional[str] = None,
                   tmp_path: Optional[Path] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The export and the messages of the LegacyKeyWarnings raised while composing it."""
    kwargs: Dict[str, Any] = {}
    if yaml is not None:
        (tmp_path / "job.yaml").write_text(yaml)
        kwargs = {"config_dir": str(tmp_path), "config_name": "job"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = dsconf.compose(list(overrides), world_size=WORLD_SIZE, **kwargs)
    return config, [str(w.message) for w in caught if issubclass(w.category, LegacyKeyWarning)]


def deepspeed_reads(config: Dict[str, Any]) -> Any:
    """DeepSpeed 0.19.8's parsed config object (what the engine would read)."""
    import deepspeed.runtime.config as ds_config

    with mock.patch.object(ds_config.dist, "get_world_size", return_value=WORLD_SIZE), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        return ds_config.DeepSpeedConfig(copy.deepcopy(config))


def assert_deepspeed_parses_as_exported(config: Dict[str, Any], deepspeed_parse) -> None:
    result = deepspeed_parse(config, WORLD_SIZE)
    assert result["ok"], result["error"]
    assert result["mismatches"] == []


# --- zero_optimization.cpu_offload / cpu_offload_param ------------------------------------------------------------


def test_cpu_offload_becomes_offload_optimizer(deepspeed_parse):
    config, messages = compose_warned(["zero=stage2", "deepspeed.zero_optimization.cpu_offload=true", MB])
    zero = config["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert "cpu_offload" not in zero and "offload_param" not in zero
    assert len(messages) == 1, messages
    assert "deepspeed.zero_optimization.cpu_offload" in messages[0]
    assert "offload_optimizer.device=cpu" in messages[0]
    assert_deepspeed_parses_as_exported(config, deepspeed_parse)

    # DeepSpeed reads the legacy spelling the same way dsconf translated it.
    legacy = copy.deepcopy(config)
    legacy["zero_optimization"].pop("offload_optimizer")
    legacy["zero_optimization"]["cpu_offload"] = True
    translated = deepspeed_reads(config).zero_config.offload_optimizer
    assert deepspeed_reads(legacy).zero_config.offload_optimizer == translated
    assert translated.device == "cpu"


def test_cpu_offload_param_becomes_offload_param(deepspeed_parse):
    config, messages = compose_warned(["zero=stage3", "deepspeed.zero_optimization.cpu_offload_param=true", MB])
    zero = config["zero_optimization"]
    assert zero["offload_param"]["device"] == "cpu"
    assert "cpu_offload_param" not in zero and "offload_optimizer" not in zero
    assert len(messages) == 1, messages
    assert "cpu_offload_param" in messages[0] and "offload_param.device=cpu" in messages[0]
    assert_deepspeed_parses_as_exported(config, deepspeed_parse)

    legacy = copy.deepcopy(config)
    legacy["zero_optimization"].pop("offload_param")
    legacy["zero_optimization"]["cpu_offload_param"] = True
    assert deepspeed_reads(legacy).zero_config.offload_param == deepspeed_reads(config).zero_config.offload_param


def test_cpu_offload_false_is_dropped_with_a_warning():
    config, messages = compose_warned(["zero=stage2", "deepspeed.zero_optimization.cpu_offload=false", MB])
    assert "offload_optimizer" not in config["zero_optimization"]
    assert "cpu_offload" not in config["zero_optimization"]
    assert len(messages) == 1 and "no effect" in messages[0]


def test_modern_config_raises_no_legacy_warning():
    _, messages = compose_warned(["zero=stage2_offload", "precision=bf16", "deepspeed.communication_data_type=fp32",
                                  MB])
    assert messages == []


@pytest.mark.parametrize("zero, key, replacement", [
    ("stage2_offload", "cpu_offload", "offload_optimizer"),
    ("stage3_offload", "cpu_offload", "offload_optimizer"),
    ("stage3_offload", "cpu_offload_param", "offload_param"),
])
def test_deprecated_offload_key_with_its_replacement_is_an_error(zero, key, replacement, deepspeed_parse):
    with pytest.raises(ConfigError) as info:
        compose_warned([f"zero={zero}", f"deepspeed.zero_optimization.{key}=true", MB])
    assert info.value.paths == [f"deepspeed.zero_optimization.{key}"]
    problem = info.value.problems[0]
    assert replacement in problem.message and f"remove {key}" in problem.hint

    # DeepSpeed refuses the same pair.
    both = compose_warned([f"zero={zero}", MB])[0]
    both["zero_optimization"][key] = True
    result = deepspeed_parse(both, WORLD_SIZE)
    assert not result["ok"] and "Cannot provide deprecated parameter" in result["error"], result


# --- fp32_allreduce ----------------------------------------------------------------------------------------------


def test_fp32_allreduce_becomes_communication_data_type(deepspeed_parse):
    config, messages = compose_warned(["deepspeed.fp32_allreduce=true", MB])
    assert config["communication_data_type"] == "fp32"
    assert "fp32_allreduce" not in config
    assert len(messages) == 1 and "communication_data_type=fp32" in messages[0]
    assert_deepspeed_parses_as_exported(config, deepspeed_parse)
    assert str(deepspeed_reads(config).communication_data_type) == "torch.float32"


def test_fp32_allreduce_agreeing_with_communication_data_type_is_accepted():
    config, messages = compose_warned(["deepspeed.fp32_allreduce=true", "deepspeed.communication_data_type=fp32", MB])
    assert config["communication_data_type"] == "fp32" and len(messages) == 1


def test_fp32_allreduce_false_is_dropped():
    config, messages = compose_warned(["deepspeed.fp32_allreduce=false", MB])
    assert "fp32_allreduce" not in config and "communication_data_type" not in config
    assert len(messages) == 1


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp32_allreduce_conflicting_with_communication_data_type_is_an_error(dtype):
    with pytest.raises(ConfigError) as info:
        compose_warned(["deepspeed.fp32_allreduce=true", f"deepspeed.communication_data_type={dtype}", MB])
    assert info.value.paths == ["deepspeed.fp32_allreduce"]
    assert f"communication_data_type='{dtype}'" in info.value.problems[0].message
    assert "remove fp32_allreduce" in info.value.problems[0].hint


# --- bfloat16 (old name of bf16) ----------------------------------------------------------------------------------
# The schema types ``bfloat16`` as Optional[BF16Config] = None. A YAML config can set it (a merge); a dotted
# command-line override needs "+" (the section is absent by default); most tests write it in a user YAML file.


def test_bfloat16_section_becomes_bf16(tmp_path, deepspeed_parse):
    config, messages = compose_warned(
        yaml=primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  bfloat16:\n    enabled: true\n"),
        tmp_path=tmp_path)
    assert config["bf16"]["enabled"] is True
    assert "bfloat16" not in config
    assert len(messages) == 1 and "deepspeed.bfloat16" in messages[0] and "deepspeed.bf16" in messages[0]
    assert_deepspeed_parses_as_exported(config, deepspeed_parse)

    legacy = copy.deepcopy(config)
    legacy["bfloat16"] = legacy.pop("bf16")
    assert deepspeed_reads(legacy).bfloat16_config.enabled is True


BUG_OPTIONAL_OVERRIDE = ("an override under an Optional[...] = None section fails in OmegaConf.update ('Unexpected "
                         "type for root: NoneType' / \"'NoneType' object has no attribute 'get'\")")


@pytest.mark.parametrize("override", ["+deepspeed.bfloat16.enabled=true",
                                      "deepspeed.bfloat16={enabled:true}"])
def test_bfloat16_section_from_the_command_line(override):
    config, messages = compose_warned([override, MB])
    assert config["bf16"]["enabled"] is True and len(messages) == 1


def test_bfloat16_conflicting_with_bf16_is_an_error(tmp_path):
    yaml = primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  bfloat16:\n    enabled: false\n",
                   "precision: bf16")
    with pytest.raises(ConfigError) as info:
        compose_warned(yaml=yaml, tmp_path=tmp_path)
    assert info.value.paths == ["deepspeed.bfloat16"]
    assert "together with bf16" in info.value.problems[0].message


def test_bfloat16_does_not_silently_drop_bf16_settings(tmp_path):
    yaml = primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  zero_optimization:\n    stage: 2\n"
                   "  bf16:\n    bf16_master_weights_and_grads: true\n  bfloat16:\n    enabled: true\n")
    try:
        config, _ = compose_warned(yaml=yaml, tmp_path=tmp_path)
    except ConfigError as err:  # refusing the pair is fine too
        assert "deepspeed.bfloat16" in err.paths
    else:
        assert config["bf16"]["bf16_master_weights_and_grads"] is True, config["bf16"]


def test_bfloat16_agreeing_with_bf16_is_accepted(tmp_path):
    yaml = primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  bfloat16:\n    enabled: true\n",
                   "precision: bf16")
    config, messages = compose_warned(yaml=yaml, tmp_path=tmp_path)
    assert config["bf16"]["enabled"] is True and "bfloat16" not in config and len(messages) == 1


# --- the same legacy input in a user's YAML config ------------------------------------------------------------


def test_legacy_keys_in_yaml_translate_like_overrides(tmp_path, deepspeed_parse):
    yaml = primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  fp32_allreduce: true\n  zero_optimization:\n"
                   "    cpu_offload: true\n  bfloat16:\n    enabled: true\n", "zero: stage2")
    from_yaml, messages = compose_warned(yaml=yaml, tmp_path=tmp_path)
    from_overrides, override_messages = compose_warned(
        ["zero=stage2", "precision=bf16", "deepspeed.fp32_allreduce=true",
         "deepspeed.zero_optimization.cpu_offload=true", MB])
    assert from_yaml == from_overrides
    assert len(messages) == 3, messages  # one per legacy key
    assert sorted(m for m in messages if "bfloat16" not in m) == sorted(override_messages)
    assert from_yaml["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert from_yaml["communication_data_type"] == "fp32" and from_yaml["bf16"]["enabled"] is True
    assert_deepspeed_parses_as_exported(from_yaml, deepspeed_parse)


def test_deprecated_key_with_replacement_in_yaml_is_an_error(tmp_path):
    yaml = primary("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n  zero_optimization:\n    cpu_offload: true\n"
                   "    offload_optimizer:\n      device: nvme\n      nvme_path: /tmp\n", "zero: stage2")
    with pytest.raises(ConfigError) as info:
        compose_warned(yaml=yaml, tmp_path=tmp_path)
    assert info.value.paths == ["deepspeed.zero_optimization.cpu_offload"]


def test_cpu_offload_keeps_the_users_other_offload_settings(deepspeed_parse):
    """Translating cpu_offload=true adds the device and keeps what the user set in offload_optimizer."""
    from dsconf.schema.introspect import default_of, fields_of
    from dsconf.schema.zero import OffloadOptimizerConfig

    pin = not default_of(fields_of(OffloadOptimizerConfig)["pin_memory"][1])
    config, messages = compose_warned(["zero=stage2", "deepspeed.zero_optimization.cpu_offload=true",
                                       f"deepspeed.zero_optimization.offload_optimizer.pin_memory={str(pin).lower()}",
                                       "deepspeed.zero_optimization.offload_optimizer.buffer_count=7", MB])
    assert len(messages) == 1, messages
    parsed = deepspeed_reads(config).zero_config.offload_optimizer
    assert (parsed.device, parsed.pin_memory, parsed.buffer_count) == ("cpu", pin, 7)
    assert_deepspeed_parses_as_exported(config, deepspeed_parse)
