"""HF's "auto": legal in exactly the keys HF Transformers' Trainer and Accelerate fill, kept for them with
``keep_auto``, and otherwise an error that names the key, where HF would take the value from, and how to set it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import dsconf
from dsconf.batch import BATCH_KEYS
from dsconf.errors import ConfigError
from dsconf.export import build_deepspeed_dict
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.hf_sources import HF_SOURCES
from dsconf.schema.introspect import fields_of, unwrap_optional
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS
from dsconf.schema.scheduler import SCHEDULERS
from dsconf.validation.normalize import deepspeed_auto

# The keys HF fills (transformers/integrations/deepspeed.py: HfTrainerDeepSpeedConfig.trainer_config_process and
# trainer_config_finalize; accelerate's DeepSpeedPlugin.deepspeed_config_process), besides the batch triple.
HF_FILLED = {
    "gradient_clipping", "fp16.enabled", "bf16.enabled",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "amp.enabled", "amp.opt_level",  # amp: older Transformers, DeepSpeed < 0.19.8
    "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    # Accelerate
    "zero_optimization.stage", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path",
}


def schema_keys() -> Iterator[Tuple[str, dataclasses.Field, Dict[str, Any]]]:
    """(dotted key, field, a config with the key's section) for every scalar key of the schema."""
    def walk(cls: type, path: List[str], context: Dict[str, Any]) -> Iterator[Tuple[str, dataclasses.Field,
                                                                                   Dict[str, Any]]]:
        for name, (tp, field) in fields_of(cls).items():
            inner, _ = unwrap_optional(tp)
            if dataclasses.is_dataclass(inner):
                yield from walk(inner, [*path, name], context)
            elif name not in ("optimizer", "scheduler", "sparse_attention", "bfloat16") or path:
                yield ".".join([*path, name]), field, context

    yield from walk(DeepSpeedConfig, [], {})
    for spec in DEEPSPEED_OPTIMIZERS.values():
        if spec.params is not None:
            yield from walk(spec.params, ["optimizer", "params"], {"optimizer": {"type": spec.type}})
    for name, model in SCHEDULERS.items():
        yield from walk(model, ["scheduler", "params"], {"scheduler": {"type": name}})


def with_value(context: Dict[str, Any], dotted: str, value: Any) -> Dict[str, Any]:
    config: Dict[str, Any] = json.loads(json.dumps(context))
    node = config
    *parents, key = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = value
    config.setdefault("train_batch_size", 8)
    return config


AUTO_KEYS = sorted({key for key, field, _ in schema_keys() if field.metadata.get("auto")})


def test_auto_is_declared_exactly_on_the_keys_hf_fills():
    assert set(AUTO_KEYS) == HF_FILLED


def test_each_auto_note_is_the_keys_entry_in_hf_sources():
    """Where HF takes a value from is said once (HF_SOURCES); the schema's "auto" notes are its entries' text."""
    notes = {key: field.metadata["auto"] for key, field, _ in schema_keys() if field.metadata.get("auto")}
    assert notes == {key: str(HF_SOURCES[key]) for key in notes}
    assert set(HF_SOURCES) == set(notes) | set(BATCH_KEYS)  # the batch keys' "auto" is dsconf's own derivation


def _export(config: Dict[str, Any], keep_auto: bool, target: str = "0.19.8") -> Dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_deepspeed_dict(config, world_size=1, target=target, keep_auto=keep_auto)


@pytest.mark.parametrize("key, field, context", [c for c in schema_keys() if c[1].metadata.get("auto")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_auto_kept_for_hf_and_refused_otherwise(key, field, context):
    config = with_value(context, key, "auto")
    if key.endswith(".nvme_path"):  # Accelerate fills an offload block's device and path together
        config = with_value(config, key.replace("nvme_path", "device"), "auto")
    spec = DEEPSPEED_OPTIMIZERS.get(str((context.get("optimizer") or {}).get("type")).lower())
    old = field.metadata.get("until") or key.startswith("amp.") or (spec is not None and spec.until)
    target = "0.19.5" if old else "0.19.8"
    exported = _export(config, keep_auto=True, target=target)
    node = exported
    for part in key.split("."):
        node = node[part]
    assert node == "auto"
    with pytest.raises(ConfigError) as info:
        _export(config, keep_auto=False, target=target)
    (problem,) = [p for p in info.value.problems if p.path == f"deepspeed.{key}"]
    assert "filled by HF" in problem.message and field.metadata["auto"] in problem.message
    assert f"deepspeed.{key}=<value>" in problem.hint and "keep_auto=true" in problem.hint


def in_pydantic_section(key: str) -> bool:
    """Whether DeepSpeed parses the key's section with a pydantic model (which drops "auto" for the default:
    tests/validation/test_lenient.py)."""
    from dsconf.schema.introspect import model_at

    section = model_at(f"deepspeed.{key.rpartition('.')[0]}") if "." in key else None
    return bool(getattr(section, "deepspeed_model", None))


OTHER_KEYS = [c for c in schema_keys() if not c[1].metadata.get("auto") and not deepspeed_auto(c[1])
              and c[0] not in BATCH_KEYS  # "auto" there means: derive (tests/test_batch.py)
              and not c[1].metadata.get("until") and not c[1].metadata.get("legacy")
              and not in_pydantic_section(c[0])]


def test_the_keys_where_auto_is_an_error_are_the_dict_parsed_ones():
    keys = {key for key, _, _ in OTHER_KEYS}
    assert {"steps_per_print", "flops_profiler.enabled", "optimizer.params.lr"} & keys == {"steps_per_print",
                                                                                          "flops_profiler.enabled"}
    assert not {"zero_optimization.overlap_comm", "fp16.loss_scale", "tensorboard.enabled"} & keys
    assert len(keys) >= 100


@pytest.mark.parametrize("key, field, context", OTHER_KEYS, ids=lambda v: v if isinstance(v, str) else "")
def test_auto_anywhere_else_is_an_error_even_for_hf(key, field, context):
    config = with_value(context, key, "auto")
    with pytest.raises(ConfigError) as info:
        _export(config, keep_auto=True)
    assert any(p.path == f"deepspeed.{key}" and "'auto' is not a value here" in p.message
               for p in info.value.problems), str(info.value)


def test_a_typical_hf_template_with_keep_auto():
    template = {
        "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto",
                              "stage3_gather_16bit_weights_on_model_save": True},
        "gradient_clipping": "auto", "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }
    exported = _export(template, keep_auto=True)
    assert exported["train_batch_size"] == exported["train_micro_batch_size_per_gpu"] == "auto"
    assert exported["fp16"]["enabled"] == exported["bf16"]["enabled"] == "auto"  # no fp16+bf16 conflict
    with pytest.raises(ConfigError) as info:
        _export(template, keep_auto=False)
    assert len(info.value.problems) == 15  # each "auto" but the batch keys, which dsconf derives


def test_keep_auto_in_composition_keeps_derived_batch_keys_auto():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = dsconf.compose(["keep_auto=true", "deepspeed.train_micro_batch_size_per_gpu=4",
                             "deepspeed.optimizer.params.lr=auto", "zero=stage2"], world_size=2)
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["train_batch_size"] == ds["gradient_accumulation_steps"] == "auto"
    assert ds["optimizer"]["params"]["lr"] == "auto"
    plain = dsconf.compose(["deepspeed.train_micro_batch_size_per_gpu=4", "zero=stage2"], world_size=2)
    assert plain["train_batch_size"] == 8


def test_keep_auto_on_the_command_line():
    args = [sys.executable, "-m", "dsconf.cli"]
    proc = subprocess.run([*args, "show", "--keep-auto", "deepspeed.gradient_clipping=auto"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gradient_clipping"] == "auto"
    proc = subprocess.run([*args, "check", "deepspeed.gradient_clipping=auto", "deepspeed.train_batch_size=8"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "deepspeed.gradient_clipping: 'auto' is filled by HF" in proc.stderr
    assert "TrainingArguments.max_grad_norm" in proc.stderr
