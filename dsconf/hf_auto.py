"""HF Transformers' ``Trainer`` on dsconf's config: every "auto" filled at compose time, as HF would fill it.

The Trainer fills DeepSpeed's "auto" values from ``TrainingArguments`` inside the job, and refuses values that
disagree with them ("Please correct the following DeepSpeed config values that mismatch TrainingArguments
values") only after the ranks have started. With ``hf`` set in dsconf's config (``hf.training_args`` names the
node holding the TrainingArguments fields), export (``dsconf.export.to_deepspeed``) does both at compose time:
``ds_config.json`` holds the values that really run, and a mismatch is a ``ConfigError`` that names both dotted
paths::

    deepspeed.optimizer.params.lr: is 0.001 but training_args.learning_rate is 5e-05: HF's Trainer refuses ...

The rules mirror, in the order HF applies them, ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
``trainer_config_finalize`` (transformers/integrations/deepspeed.py; the class is internal to TrainingArguments),
then what Accelerate fills for the Trainer (``DeepSpeedPlugin.__post_init__`` and
``Accelerator._prepare_deepspeed``). What each key is filled from (the TrainingArguments fields, Accelerate's
plugin fields, the model's hidden size) is ``dsconf.schema.hf_sources.HF_SOURCES``, which the schema's "auto"
notes show too; only how HF computes each value is code here. tests/integrations/test_hf.py holds the rules
against HF's own class over a grid. TrainingArguments' defaults and ``get_warmup_steps`` are read from the
installed ``transformers`` (public API), imported only when ``hf`` is set.

This is an export concern (no job, no rank): in a rank, ``dsconf.integrations.hf.training_arguments(cfg)``
builds the TrainingArguments that go with the job's dict.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from dsconf.errors import ConfigError, Problem, did_you_mean, join_path
from dsconf.schema.hf_sources import HF_SOURCES

AUTO = "auto"
PREFIX = "deepspeed"
HIDDEN_SIZE_KEYS = tuple(key for key, source in HF_SOURCES.items() if source.model)
INSTALL_HINT = "install HF Transformers: pip install 'dsconf[hf]'"


@dataclass(frozen=True)
class Fill:
    """One of HF's ``fill_match`` calls: ``ds_key`` takes ``value(args)``; unless ``must_match`` says no, a value
    that is not "auto" and differs is a mismatch. Where the value comes from is the key's ``HF_SOURCES`` entry."""

    ds_key: str
    value: Callable[[Any], Any]
    must_match: Callable[[Any], bool] = lambda args: True

    @property
    def fields(self) -> Tuple[str, ...]:
        """The TrainingArguments fields the value comes from."""
        return HF_SOURCES[self.ds_key].args

    @property
    def calculated(self) -> str:
        """How HF calculates the value, for the message ("" when it is simply the fields' value)."""
        return HF_SOURCES[self.ds_key].formula


def _batch(args: Any) -> int:
    return args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps


# HfTrainerDeepSpeedConfig.trainer_config_process, in HF's order.
TRAINER_PROCESS = (
    # TrainingArguments runs this without auto_find_batch_size, so batch mismatches are always recorded
    Fill("train_micro_batch_size_per_gpu", lambda a: a.per_device_train_batch_size),
    Fill("gradient_accumulation_steps", lambda a: a.gradient_accumulation_steps),
    Fill("train_batch_size", _batch),
    Fill("gradient_clipping", lambda a: a.max_grad_norm),
    Fill("optimizer.params.lr", lambda a: a.learning_rate),
    Fill("optimizer.params.betas", lambda a: [a.adam_beta1, a.adam_beta2]),
    Fill("optimizer.params.eps", lambda a: a.adam_epsilon),
    Fill("optimizer.params.weight_decay", lambda a: a.weight_decay),
    Fill("scheduler.params.warmup_min_lr", lambda a: 0, lambda a: False),  # not a TrainingArguments field
    Fill("scheduler.params.warmup_max_lr", lambda a: a.learning_rate),
    Fill("fp16.enabled", lambda a: bool(a.fp16 or a.fp16_full_eval)),
    Fill("bf16.enabled", lambda a: bool(a.bf16 or a.bf16_full_eval)),
)

# What Accelerate's DeepSpeedPlugin (created inside TrainingArguments) fills next: its own fields (HF_SOURCES'
# ``plugin``), from the environment variables `accelerate launch` sets, else these defaults of the plugin's, read
# as the plugin reads them. Never checked against anything.
ACCELERATE_PLUGIN_KEYS = tuple(key for key, source in HF_SOURCES.items() if source.plugin)
ACCELERATE_PLUGIN_DEFAULTS: Dict[str, Tuple[str, Callable[[str], Any]]] = {
    "zero_optimization.stage": ("2", int),
    "zero_optimization.offload_optimizer.device": ("none", str),
    "zero_optimization.offload_param.device": ("none", str),
    "zero_optimization.offload_param.nvme_path": ("none", str),
    "zero_optimization.offload_optimizer.nvme_path": ("none", str),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": ("false", lambda text: text.lower() == "true"),
}


def accelerate_plugin_value(key: str) -> Any:
    """What Accelerate's DeepSpeedPlugin fills ``key`` (one of ``ACCELERATE_PLUGIN_KEYS``) with."""
    default, read = ACCELERATE_PLUGIN_DEFAULTS[key]
    return read(os.environ.get(HF_SOURCES[key].accelerate_env, default))


def hidden_size_values(hidden_size: int) -> Dict[str, int]:
    """HF's and Accelerate's values for the hidden-size-based ZeRO keys (``HIDDEN_SIZE_KEYS``)."""
    return {"zero_optimization.reduce_bucket_size": hidden_size * hidden_size,
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
            "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size}


def model_hidden_size(model_config: Any) -> Optional[int]:
    """The hidden size HF reads from a model config (a mapping or an object), in HF's order; None if none."""
    def get(node: Any, key: str) -> Any:
        return node.get(key) if isinstance(node, Mapping) or hasattr(node, "keys") else getattr(node, key, None)

    if model_config is None:
        return None
    for node in (model_config, get(model_config, "text_config")):
        if node is None:
            continue
        if get(node, "hidden_size") is not None:
            return int(get(node, "hidden_size"))
        if get(node, "hidden_sizes") is not None:
            return int(max(get(node, "hidden_sizes")))
    return None


@functools.cache
def _defaults() -> Tuple[Tuple[str, Any], ...]:
    """TrainingArguments' fields and their defaults, read once per process."""
    TrainingArguments = training_arguments_class()
    out: Dict[str, Any] = {}
    for field in dataclasses.fields(TrainingArguments):
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[field.name] = field.default_factory()  # type: ignore[misc]
        else:
            out[field.name] = None
    return tuple(out.items())


def training_args_defaults() -> Dict[str, Any]:
    """TrainingArguments' fields and their defaults, from the installed ``transformers``."""
    return dict(_defaults())


def trainer_args(values: Mapping[str, Any], world_size: int) -> Any:
    """What HF's rules read of ``TrainingArguments``: its defaults, the user's ``values``, the job's world size."""
    args = types.SimpleNamespace(**{**training_args_defaults(), **dict(values)})
    args.world_size = world_size
    args.get_warmup_steps = functools.partial(training_arguments_class().get_warmup_steps, args)
    return args


def num_training_steps(args: Any, train_examples: Optional[int]) -> Optional[int]:
    """The Trainer's total optimizer steps: ``max_steps``, else epochs x steps per epoch for ``train_examples``
    split as Accelerate shards the Trainer's dataloader; None when neither is known."""
    if args.max_steps is not None and args.max_steps > 0:
        return int(args.max_steps)
    if not train_examples:
        return None
    batches = train_examples // args.per_device_train_batch_size if args.dataloader_drop_last else \
        math.ceil(train_examples / args.per_device_train_batch_size)
    per_rank = batches // args.world_size if args.dataloader_drop_last or batches % args.world_size == 0 else \
        batches // args.world_size + 1  # even_batches: short ranks loop back to the start
    per_epoch = max(math.ceil(per_rank / args.gradient_accumulation_steps), 1)
    return math.ceil(args.num_train_epochs * per_epoch)


class _Config:
    """The dict being filled, read and written by dotted key as HF's ``find_config_node`` does."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config

    def node(self, dotted: str) -> Tuple[Optional[Dict[str, Any]], str]:
        *parents, key = dotted.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return node, key

    def get(self, dotted: str) -> Any:
        node, key = self.node(dotted)
        return None if node is None else node.get(key)

    def is_auto(self, dotted: str) -> bool:
        return self.get(dotted) == AUTO


def fill_auto(ds: Dict[str, Any], args: Any, *, args_path: str = "training_args", hidden_size: Optional[int] = None,
              total_steps: Optional[int] = None) -> Tuple[Dict[str, Any], List[Problem]]:
    """``ds`` (a copy) with HF's "auto" values filled for ``args``, and a problem for each mismatch HF would raise.

    Keys HF cannot fill here (the hidden-size keys without ``hidden_size``, the scheduler's steps without
    ``total_steps``) stay "auto"; ``unfilled`` reports them.
    """
    config = _Config(copy.deepcopy(ds))
    problems: List[Problem] = []

    def fill_match(fill: Fill, hf_value: Any) -> None:
        node, key = config.node(fill.ds_key)
        if node is None:
            return
        if node.get(key) == AUTO:
            node[key] = hf_value
        elif fill.must_match(args) and node.get(key) is not None and node.get(key) != hf_value:
            problems.append(_mismatch(fill, node.get(key), hf_value, args, args_path))

    for fill in TRAINER_PROCESS:
        fill_match(fill, fill.value(args))
    if args.save_on_each_node:
        config.config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    for dotted in ACCELERATE_PLUGIN_KEYS:
        if config.is_auto(dotted):
            _fill_only(config, dotted, accelerate_plugin_value(dotted))
    if total_steps is not None:
        fill_match(Fill("scheduler.params.total_num_steps", lambda a: total_steps), total_steps)
        fill_match(Fill("scheduler.params.warmup_num_steps", lambda a: None),
                   max(1, args.get_warmup_steps(total_steps)))
    if hidden_size is not None:
        # HF fills the two stage-3 keys for ZeRO-3 only, and Accelerate whatever is still "auto", with the same
        # values: one pass gives both
        for dotted, value in hidden_size_values(hidden_size).items():
            _fill_only(config, dotted, value)
    _fill_only(config, "gradient_clipping", 1.0)  # Accelerator._prepare_deepspeed's remaining defaults
    _fill_only(config, "zero_optimization.stage3_gather_16bit_weights_on_model_save", False)
    return config.config, problems


def _fill_only(config: _Config, dotted: str, value: Any) -> None:
    node, key = config.node(dotted)
    if node is not None and node.get(key) == AUTO:
        node[key] = value


def _mismatch(fill: Fill, ds_value: Any, hf_value: Any, args: Any, args_path: str) -> Problem:
    if fill.calculated:
        source = f"{fill.calculated} is {hf_value!r}"
        if fill.fields:
            source += " (" + ", ".join(f"{join_path(args_path, f)}={getattr(args, f)!r}" for f in fill.fields) + \
                      f", world size {args.world_size})"
    else:
        source = " and ".join(f"{join_path(args_path, f)} is {getattr(args, f)!r}" for f in fill.fields)
    fields = " / ".join(join_path(args_path, f) for f in fill.fields) or "the training arguments"
    return Problem(join_path(PREFIX, fill.ds_key),
                   f"is {ds_value!r} but {source}: HF's Trainer refuses DeepSpeed values that disagree with "
                   "TrainingArguments",
                   f"set it to auto (HF then uses {hf_value!r}), or change {fields}")


def unfilled(ds: Mapping[str, Any], *, args_path: str, model_config_path: Optional[str]) -> List[Problem]:
    """A problem for each "auto" left after ``fill_auto``: what HF would need to fill it."""
    config = _Config(dict(ds))
    problems = []
    for dotted in HIDDEN_SIZE_KEYS:
        if config.is_auto(dotted):
            where = (f"the node at hf.model_config ({model_config_path}) has no hidden_size or hidden_sizes"
                     if model_config_path else "hf.model_config is not set")
            problems.append(Problem(join_path(PREFIX, dotted), f"'auto' is filled from the model's hidden size, "
                                    f"and {where}", "set hf.model_config to the node of the model's config, or "
                                    "give a number"))
    for dotted in ("scheduler.params.total_num_steps", "scheduler.params.warmup_num_steps"):
        if config.is_auto(dotted):
            problems.append(Problem(join_path(PREFIX, dotted), "'auto' is filled from the number of training "
                                    "steps, which depends on the dataset",
                                    f"set {join_path(args_path, 'max_steps')}, or hf.train_examples (the number of "
                                    "training examples), or give a number"))
    return problems


def resolve(cfg: Any, ds_with_auto: Dict[str, Any], world_size: int) -> Dict[str, Any]:
    """The dict of ``cfg`` (its keep_auto export ``ds_with_auto``) with every "auto" filled as HF's Trainer fills
    it for ``world_size`` ranks; a ``ConfigError`` for each mismatch HF would raise or value it could not fill."""
    from omegaconf import OmegaConf

    hf = hf_settings(cfg)
    args_path = str(hf.training_args)
    values = training_args_values(cfg, args_path)
    args = trainer_args(values, world_size)
    model_config = None
    if hf.get("model_config"):
        model_config = OmegaConf.select(cfg, str(hf.model_config))
        if model_config is None:
            raise ConfigError(Problem("hf.model_config", f"no node at '{hf.model_config}' in the config",
                                      "the dotted path of the node holding the model config's hidden_size"))
        model_config = OmegaConf.to_container(model_config, resolve=True) if OmegaConf.is_config(model_config) \
            else model_config
    filled, problems = fill_auto(ds_with_auto, args, args_path=args_path, hidden_size=model_hidden_size(model_config),
                                 total_steps=num_training_steps(args, hf.get("train_examples")))
    problems += unfilled(filled, args_path=args_path, model_config_path=hf.get("model_config"))
    if problems:
        raise ConfigError(problems)
    return filled


def hf_settings(cfg: Any) -> Any:
    """The config's ``hf`` node read against its schema (``HfConfig``): unknown keys and bad values are problems."""
    from omegaconf import OmegaConf

    from dsconf.schema.integrations import HfConfig
    from dsconf.validation.settings import settings_problems

    given = OmegaConf.to_container(cfg.hf, resolve=True) if OmegaConf.is_config(cfg.hf) else dict(cfg.hf)
    problems = settings_problems(given, HfConfig, "hf")  # types and bounds from HfConfig's own field metadata
    if problems:
        raise ConfigError(problems)
    return OmegaConf.merge(OmegaConf.structured(HfConfig), given)


def training_args_values(cfg: Any, args_path: str) -> Dict[str, Any]:
    """The TrainingArguments fields the config holds at ``args_path``; unknown field names are problems."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, args_path)
    if node is None or not OmegaConf.is_dict(node):
        raise ConfigError(Problem("hf.training_args", f"no mapping at '{args_path}' in the config",
                                  "the dotted path of the node holding TrainingArguments' fields"))
    values = OmegaConf.to_container(node, resolve=True)
    known = training_args_defaults()
    problems = [Problem(join_path(args_path, str(key)), "not a TrainingArguments field", did_you_mean(str(key), known))
                for key in values if key not in known]
    if "deepspeed" in values:
        problems.append(Problem(join_path(args_path, "deepspeed"), "dsconf passes the job's DeepSpeed dict itself",
                                "remove it: the config's deepspeed node is what the Trainer gets"))
    if problems:
        raise ConfigError(problems)
    return values  # type: ignore[return-value]


def training_arguments_class() -> Any:
    """HF's ``TrainingArguments`` class, or a ``ConfigError`` saying how to install it."""
    try:
        from transformers import TrainingArguments
    except ImportError as err:
        raise ConfigError(Problem("hf", f"HF Transformers is not installed ({err})", INSTALL_HINT)) from None
    return TrainingArguments
