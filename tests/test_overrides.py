"""Dotted overrides reach every key of every section, also sections that are null until written (they cost
composition nothing while untouched), and a misspelt key there gets dsconf's did-you-mean."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest
from omegaconf import OmegaConf

import dsconf
from dsconf.composition import compose_config
from dsconf.errors import ConfigError
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import default_of, fields_of, unwrap_optional


def lazy_sections() -> Iterator[Tuple[str, type]]:
    for name, (tp, field) in fields_of(DeepSpeedConfig).items():
        inner, _ = unwrap_optional(tp)
        if dataclasses.is_dataclass(inner) and field.default is None:
            yield name, inner


def override_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def settable_keys() -> List[Tuple[str, str, Any]]:
    """(section, key, a value) for up to three scalar keys of every lazy section."""
    rows = []
    for section, model in lazy_sections():
        keys = list(_scalar_keys(model, "")) or list(_nested_keys(model))
        rows += [(section, key, value) for key, value in keys[:3]]
    return rows


def _scalar_keys(model: type, prefix: str) -> Iterator[Tuple[str, Any]]:
    for key, (tp, field) in fields_of(model).items():
        value = default_of(field)
        inner, _ = unwrap_optional(tp)
        choices = field.metadata.get("choices")
        if value is None and choices:
            value = choices[-1]
        if inner in (bool, int, float, str) and value is not None:
            yield prefix + key, (not value) if inner is bool else value


def _nested_keys(model: type) -> Iterator[Tuple[str, Any]]:
    for key, (tp, _) in fields_of(model).items():
        inner, _ = unwrap_optional(tp)
        if dataclasses.is_dataclass(inner):
            yield from _scalar_keys(inner, f"{key}.")


def test_every_section_dsconf_models_lazily_is_covered():
    names = {s for s, *_ in settable_keys()}
    # compression_training holds free-form technique blocks only (tested below)
    assert {name for name, _ in lazy_sections()} - names <= {"compression_training"}
    assert {"tensorboard", "flops_profiler", "aio", "activation_checkpointing", "checkpoint", "timers"} <= names


@pytest.mark.parametrize("section, key, value", settable_keys(), ids=lambda v: str(v))
def test_dotted_override_reaches_a_null_section(section, key, value):
    cfg = compose_config([f"deepspeed.{section}.{key}={override_text(value)}"])
    assert OmegaConf.select(cfg, f"deepspeed.{section}.{key}") == value


def test_overrides_fill_a_null_section_and_export_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = dsconf.compose(["deepspeed.train_batch_size=8", "deepspeed.tensorboard.enabled=true",
                             "deepspeed.tensorboard.output_path=/tmp/tb",
                             "deepspeed.activation_checkpointing.partition_activations=true"], world_size=1)
    assert ds["tensorboard"] == {"enabled": True, "output_path": "/tmp/tb"}
    assert ds["activation_checkpointing"] == {"partition_activations": True}
    untouched = dsconf.compose(["deepspeed.train_batch_size=8"], world_size=1)
    assert "tensorboard" not in untouched and "aio" not in untouched


def test_a_misspelt_key_in_a_null_section_gets_a_hint():
    with pytest.raises(ConfigError) as info:
        dsconf.compose(["deepspeed.train_batch_size=8", "deepspeed.flops_profiler.profile_stpe=3"])
    assert info.value.paths == ["deepspeed.flops_profiler.profile_stpe"]
    assert "did you mean 'profile_step'?" in str(info.value)


def test_a_misspelt_top_level_key_gets_a_hint():
    with pytest.raises(ConfigError) as info:
        dsconf.compose(["deepspeed.train_batch_size=8", "deepspeed.tensorbaord.enabled=true"])
    assert info.value.paths == ["deepspeed.tensorbaord"]
    assert "did you mean 'tensorboard'" in str(info.value)


def test_dotted_override_reaches_free_form_blocks():
    cfg = compose_config(["deepspeed.compression_training.layer_reduction.enabled=true", "deepspeed_version=0.19.5"])
    assert cfg.deepspeed.compression_training.layer_reduction.enabled is True


@pytest.mark.parametrize("override, path, hint", [
    # a key of dsconf's schema that the config's node does not hold yet (hf is given in part by the YAML)
    ("hf.train_examples=512", "hf.train_examples", "add it with '+hf.train_examples=512'"),
    # a node of the user's own: only the user knows its keys
    ("training_args.max_grad_norm=0.5", "training_args.max_grad_norm",
     "add it with '+training_args.max_grad_norm=0.5'"),
    # a misspelt key of the schema keeps its did-you-mean, even where Hydra suggests '+'
    ("hf.train_exmaples=512", "hf.train_exmaples", "did you mean 'train_examples'?"),
])
def test_a_key_the_composed_node_lacks_says_how_to_add_it(override, path, hint):
    config_dir = str(Path(__file__).resolve().parents[1] / "examples" / "conf")
    with pytest.raises(ConfigError) as info:
        compose_config([override], config_dir=config_dir, config_name="hf_trainer")
    assert info.value.paths == [path]
    assert hint in str(info.value)
    assert ("not in the composed config" in str(info.value)) == hint.startswith("add it")
    if hint.startswith("add it"):  # and the hint works
        added = compose_config(["+" + override], config_dir=config_dir, config_name="hf_trainer")
        assert str(OmegaConf.select(added, path)) == override.split("=")[1]
