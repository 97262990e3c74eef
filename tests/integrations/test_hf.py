"""HF Trainer's "auto": dsconf fills it at compose time exactly as HF's own code does, and refuses every mismatch HF
would raise, naming both dotted paths.

The oracle is HF's code run on dsconf's keep_auto export of the same config (what HF would be given without dsconf):
``HfTrainerDeepSpeedConfig.trainer_config_process`` on a real ``TrainingArguments``, Accelerate's
``DeepSpeedPlugin`` built from it (as ``TrainingArguments.__post_init__`` does), ``trainer_config_finalize``, then
Accelerate's ``deepspeed_config_process`` with the values ``Accelerator._prepare_deepspeed`` passes.
"""

from __future__ import annotations

import copy
import itertools
import types
from typing import Any, Dict, List

import pytest
from omegaconf import OmegaConf
from optional_packages import requires

from dsconf import hf_auto as hf
from dsconf.composition import compose_config
from dsconf.errors import ConfigError
from dsconf.export import to_deepspeed
from dsconf.schema.hf_sources import HF_SOURCES

pytestmark = requires("transformers", "the hf extra is not installed")

HIDDEN = 48
AUTO_TEMPLATE = [  # HF's documented ZeRO template: every key HF fills is "auto"
    "deepspeed.train_batch_size=auto", "deepspeed.train_micro_batch_size_per_gpu=auto",
    "deepspeed.gradient_accumulation_steps=auto", "deepspeed.gradient_clipping=auto",
    "optimizer=adamw", "deepspeed.optimizer.params.lr=auto", "deepspeed.optimizer.params.betas=auto",
    "deepspeed.optimizer.params.eps=auto", "deepspeed.optimizer.params.weight_decay=auto",
    "scheduler=warmup_decay", "deepspeed.scheduler.params.warmup_min_lr=auto",
    "deepspeed.scheduler.params.warmup_max_lr=auto", "deepspeed.scheduler.params.warmup_num_steps=auto",
    "deepspeed.scheduler.params.total_num_steps=auto",
    "deepspeed.fp16.enabled=auto", "deepspeed.bf16.enabled=auto",
    "deepspeed.zero_optimization.reduce_bucket_size=auto",
    "deepspeed.zero_optimization.stage3_prefetch_bucket_size=auto",
    "deepspeed.zero_optimization.stage3_param_persistence_threshold=auto",
]
HF_KEYS = ["+hf.training_args=training_args", "+hf.model_config=model", f"+model.hidden_size={HIDDEN}"]

ARGS_GRID = [
    dict(per_device_train_batch_size=pb, gradient_accumulation_steps=gas, learning_rate=lr, max_steps=steps,
         warmup_steps=warmup, **precision, **extra)
    for pb, gas, lr, steps, warmup, precision, extra in itertools.product(
        [1, 4], [1, 3], [5e-5, 1e-3], [10, 7], [0, 3, 0.25],
        [{}, {"bf16": True}, {"fp16": True}, {"bf16_full_eval": True}],
        [{}, {"adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6, "weight_decay": 0.1, "max_grad_norm": 0.5,
              "save_on_each_node": True}])
]


def compose(*overrides: str) -> Any:
    return compose_config([*HF_KEYS, *overrides])


def with_args(cfg: Any, values: Dict[str, Any]) -> Any:
    cfg = copy.deepcopy(cfg)
    OmegaConf.set_struct(cfg, False)
    cfg.training_args = {"output_dir": "out", "use_cpu": True, "report_to": [], **values}
    return cfg


class AtWorldSize:
    """A real TrainingArguments seen with another world size (its own is this process's: 1)."""

    def __init__(self, args: Any, world_size: int) -> None:
        self._args, self.world_size = args, world_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._args, name)


def hf_fills(with_auto: Dict[str, Any], values: Dict[str, Any], world_size: int, hidden: int = HIDDEN) -> Dict:
    """What HF's own code makes of ``with_auto`` (ValueError on a mismatch)."""
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = AtWorldSize(TrainingArguments(**{"output_dir": "out", "use_cpu": True, "report_to": [], **values}),
                       world_size)
    config = HfTrainerDeepSpeedConfig(copy.deepcopy(with_auto))
    config.trainer_config_process(args)
    plugin = DeepSpeedPlugin(hf_ds_config=config)  # as TrainingArguments.__post_init__ creates it
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden))
    config.trainer_config_finalize(args, model, values["max_steps"])
    plugin.deepspeed_config_process(must_match=False, **{  # Accelerator._prepare_deepspeed's remaining values
        "gradient_clipping": 1.0, "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        **hf.hidden_size_values(hidden)})
    out = plugin.deepspeed_config
    assert out.pop("steps_per_print") == float("inf")  # Accelerate turns DeepSpeed's step log off, always
    return out


def without_steps_per_print(ds: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in ds.items() if k != "steps_per_print"}


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.slow  # about 1,000 TrainingArguments each
def test_auto_is_filled_as_hf_fills_it_over_a_grid(stage):
    base = compose(*AUTO_TEMPLATE, f"zero=stage{stage}")
    checked = 0
    for values, world_size in itertools.product(ARGS_GRID, [1, 2, 8]):
        if values.get("fp16") and values.get("bf16_full_eval"):
            continue
        cfg = with_args(base, values)
        ours = to_deepspeed(cfg, world_size=world_size)
        theirs = hf_fills(to_deepspeed(cfg, world_size=world_size, keep_auto=True), values, world_size)
        assert without_steps_per_print(ours) == theirs, (values, world_size)
        checked += 1
    assert checked >= 1000


MISMATCHES = [  # (dsconf override, TrainingArguments, the two paths the problem names)
    ("deepspeed.train_micro_batch_size_per_gpu=2", {"per_device_train_batch_size": 4},
     "deepspeed.train_micro_batch_size_per_gpu", "training_args.per_device_train_batch_size"),
    ("deepspeed.gradient_accumulation_steps=2", {"gradient_accumulation_steps": 1},
     "deepspeed.gradient_accumulation_steps", "training_args.gradient_accumulation_steps"),
    ("deepspeed.train_batch_size=64", {}, "deepspeed.train_batch_size", "training_args.per_device_train_batch_size"),
    ("deepspeed.gradient_clipping=0.3", {}, "deepspeed.gradient_clipping", "training_args.max_grad_norm"),
    ("deepspeed.optimizer.params.lr=0.01", {}, "deepspeed.optimizer.params.lr", "training_args.learning_rate"),
    ("deepspeed.optimizer.params.betas=[0.9,0.95]", {}, "deepspeed.optimizer.params.betas",
     "training_args.adam_beta2"),
    ("deepspeed.optimizer.params.eps=1e-6", {}, "deepspeed.optimizer.params.eps", "training_args.adam_epsilon"),
    ("deepspeed.optimizer.params.weight_decay=0.1", {}, "deepspeed.optimizer.params.weight_decay",
     "training_args.weight_decay"),
    ("deepspeed.scheduler.params.warmup_max_lr=0.5", {}, "deepspeed.scheduler.params.warmup_max_lr",
     "training_args.learning_rate"),
    ("deepspeed.scheduler.params.total_num_steps=99", {}, "deepspeed.scheduler.params.total_num_steps",
     "number of training steps"),
    ("deepspeed.scheduler.params.warmup_num_steps=5", {"warmup_steps": 2},
     "deepspeed.scheduler.params.warmup_num_steps",
     "training_args.warmup_steps"),
    ("precision=bf16", {}, "deepspeed.bf16.enabled", "training_args.bf16"),
    ("deepspeed.fp16.enabled=false", {"fp16": True}, "deepspeed.fp16.enabled", "training_args.fp16"),
]


@pytest.mark.parametrize("override, values, ds_path, hf_path", MISMATCHES, ids=[m[2] for m in MISMATCHES])
@pytest.mark.parametrize("world_size", [1, 4])
def test_every_mismatch_hf_raises_is_a_config_error_naming_both_paths(override, values, ds_path, hf_path,
                                                                      world_size):
    base = [k for k in AUTO_TEMPLATE if not k.startswith(override.split("=")[0]) and
            not (override.startswith("precision") and "enabled" in k)]
    values = {"max_steps": 10, **values}
    cfg = with_args(compose(*base, override, "zero=stage2"), values)
    with pytest.raises(ValueError, match="mismatch TrainingArguments"):
        hf_fills(to_deepspeed(cfg, world_size=world_size, keep_auto=True), values, world_size)
    with pytest.raises(ConfigError) as err:
        to_deepspeed(cfg, world_size=world_size)
    problems = [p for p in err.value.problems if p.path == ds_path]
    assert len(problems) == 1 and hf_path in problems[0].message, str(err.value)
    assert "auto" in problems[0].hint


def test_values_that_agree_with_the_training_arguments_pass():
    values = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "learning_rate": 0.01,
              "max_grad_norm": 0.3, "max_steps": 12, "warmup_steps": 4, "bf16": True}
    cfg = with_args(compose("precision=bf16", "zero=stage2", "optimizer=adamw", "deepspeed.optimizer.params.lr=0.01",
                            "deepspeed.gradient_clipping=0.3", "deepspeed.train_micro_batch_size_per_gpu=2",
                            "deepspeed.gradient_accumulation_steps=2"), values)
    ours = to_deepspeed(cfg, world_size=2)
    assert ours["train_batch_size"] == 8 and ours["optimizer"]["params"]["lr"] == 0.01
    assert without_steps_per_print(ours) == hf_fills(to_deepspeed(cfg, world_size=2, keep_auto=True), values, 2)


def test_train_examples_give_the_trainers_steps():
    # max_steps unset: epochs x optimizer steps per epoch of each rank's share of the dataset
    cfg = with_args(compose(*AUTO_TEMPLATE, "zero=stage2", "+hf.train_examples=100"),
                    {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 3, "num_train_epochs": 2,
                     "warmup_steps": 0.1})
    params = to_deepspeed(cfg, world_size=2)["scheduler"]["params"]
    # 100 examples / 4 = 25 batches; 13 per rank (even batches); ceil(13 / 3) = 5 steps per epoch; 2 epochs
    assert params["total_num_steps"] == 10 and params["warmup_num_steps"] == 1


@pytest.mark.parametrize("dropped, path, expected", [
    ("+hf.model_config=model", "deepspeed.zero_optimization.reduce_bucket_size", "hf.model_config is not set"),
    ("max_steps", "deepspeed.scheduler.params.total_num_steps", "training_args.max_steps"),
])
def test_what_hf_cannot_fill_at_compose_time_says_what_to_set(dropped, path, expected):
    overrides = [k for k in HF_KEYS if k != dropped]
    cfg = compose_config([*overrides, *AUTO_TEMPLATE, "zero=stage3"])
    values = {} if dropped == "max_steps" else {"max_steps": 10}
    with pytest.raises(ConfigError) as err:
        to_deepspeed(with_args(cfg, values), world_size=1)
    assert any(p.path == path and expected in (p.message + " " + (p.hint or "")) for p in err.value.problems), \
        str(err.value)


def test_unknown_training_arguments_field_gets_a_did_you_mean():
    cfg = with_args(compose(*AUTO_TEMPLATE), {"max_steps": 5, "learning_rat": 0.1})
    with pytest.raises(ConfigError) as err:
        to_deepspeed(cfg, world_size=1)
    assert "training_args.learning_rat: not a TrainingArguments field" in str(err.value)
    assert "learning_rate" in str(err.value)


def test_our_fill_table_names_real_training_arguments_fields():
    fields = set(hf.training_args_defaults())
    named: List[str] = [f for fill in hf.TRAINER_PROCESS for f in fill.fields]
    assert named and set(named) <= fields
    assert {f for source in HF_SOURCES.values() for f in source.args} - {"fp16_opt_level"} <= fields  # amp: older HF


def test_every_key_we_fill_is_one_hf_sources_names():
    """HF_SOURCES is the one statement of what each key is filled from: every key filled here has its entry, and
    every entry is filled here but Apex AMP's (which the installed Transformers no longer fills)."""
    filled = ({fill.ds_key for fill in hf.TRAINER_PROCESS} | set(hf.ACCELERATE_PLUGIN_KEYS) | set(hf.HIDDEN_SIZE_KEYS)
              | {"scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps"})  # trainer_config_finalize
    assert filled == set(HF_SOURCES) - {"amp.enabled", "amp.opt_level"}
    assert set(hf.ACCELERATE_PLUGIN_DEFAULTS) == set(hf.ACCELERATE_PLUGIN_KEYS)
    assert set(hf.hidden_size_values(HIDDEN)) == set(hf.HIDDEN_SIZE_KEYS)


def test_keep_auto_and_hf_together_is_a_contradiction_not_a_choice():
    cfg = with_args(compose(*AUTO_TEMPLATE, "keep_auto=true"), {"max_steps": 5})
    with pytest.raises(ConfigError) as err:
        to_deepspeed(cfg, world_size=1)
    assert [p.path for p in err.value.problems] == ["keep_auto"]


@pytest.mark.parametrize("override, path, expected", [
    ("+hf.model_confg=model", "hf.model_confg", "did you mean 'model_config'"),
    ("+hf.train_examples=0", "hf.train_examples", "0 is out of range (must be > 0)"),
    ("+hf.train_examples=true", "hf.train_examples", "expected an integer, got True"),
    ("++hf.training_args=5", "hf.training_args", "expected a string, got 5"),
])
def test_the_hf_node_is_read_against_its_schema(override, path, expected):
    cfg = with_args(compose(*AUTO_TEMPLATE, override), {"max_steps": 5})
    with pytest.raises(ConfigError) as err:
        to_deepspeed(cfg, world_size=1)
    assert any(p.path == path and expected in f"{p.message} ({p.hint})" for p in err.value.problems), str(err.value)
