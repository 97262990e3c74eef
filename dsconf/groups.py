"""dsconf's config groups: the base config ``dsconf`` and every group option.

Groups are top-level (``zero=stage2``), each packaged into the ``deepspeed`` node it configures. They are stored in
dsconf's own store and reach Hydra only through dsconf's config source, in dsconf apps (``dsconf.config_source``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict

from hydra.core.config_store import ConfigStore

from dsconf.names import BASE_CONFIG_NAME, PROVIDER
from dsconf.schema.activation_checkpointing import ActivationCheckpointingConfig
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, TORCH_OPTIMIZER_PARAMS, OptimizerConfig, optimizer_preset
from dsconf.schema.root import DEEPSPEED_NODE, DsconfConfig
from dsconf.schema.scheduler import scheduler_preset
from dsconf.schema.sparse_attention import SPARSITY_MODES

PRECISION: Dict[str, Dict[str, Any]] = {
    "fp32": {},
    "fp16": {"fp16": {"enabled": True}},
    "bf16": {"bf16": {"enabled": True}},
    "amp": {"amp": {"enabled": True, "opt_level": "O1"}},
    "torch_autocast": {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
}

_CPU_OPTIMIZER = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
ZERO: Dict[str, Dict[str, Any]] = {
    "stage0": {"stage": 0},
    "stage1": {"stage": 1},
    "stage2": {"stage": 2},
    "stage3": {"stage": 3},
    "stage1_offload": {"stage": 1, **_CPU_OPTIMIZER},
    "stage2_offload": {"stage": 2, **_CPU_OPTIMIZER},
    "stage3_offload": {"stage": 3, **_CPU_OPTIMIZER, "offload_param": {"device": "cpu", "pin_memory": True}},
    "stage3_offload_optimizer": {"stage": 3, **_CPU_OPTIMIZER},
}

# Option name -> optimizer type; the params model comes from the optimizer schema.
OPTIMIZER_OPTIONS = {
    "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb", "onebitadam": "OneBitAdam", "onebitlamb": "OneBitLamb",
    "zerooneadam": "ZeroOneAdam", "lion": "Lion", "adagrad": "Adagrad", "sgd": "SGD",
}

SCHEDULER_OPTIONS = {
    "warmup": "WarmupLR", "warmup_decay": "WarmupDecayLR", "warmup_cosine": "WarmupCosineLR",
    "one_cycle": "OneCycle", "lr_range_test": "LRRangeTest",
}

ACTIVATION_CHECKPOINTING: Dict[str, Any] = {
    "default": ActivationCheckpointingConfig(),
    "partitioned": ActivationCheckpointingConfig(partition_activations=True, contiguous_memory_optimization=True),
    "cpu": ActivationCheckpointingConfig(partition_activations=True, contiguous_memory_optimization=True,
                                         cpu_checkpointing=True),
    "profile": ActivationCheckpointingConfig(profile=True),
}


def group_options() -> Dict[str, list]:
    """Every group and its options, in the order users see them."""
    return {
        "precision": list(PRECISION),
        "zero": list(ZERO),
        "optimizer": ["none", *OPTIMIZER_OPTIONS, "torch"],
        "scheduler": ["none", *SCHEDULER_OPTIONS],
        "sparse_attention": ["none", *SPARSITY_MODES],
        "activation_checkpointing": ["none", *ACTIVATION_CHECKPOINTING],
    }


class GroupStore(ConfigStore):
    """dsconf's base config and group options: a ConfigStore of dsconf's own, read by Hydra only through dsconf's
    config source, in dsconf apps (``dsconf.config_source``). Hydra's ``Singleton`` gives each subclass one
    instance, carried with Hydra's singleton state to spawned ranks and sweep workers."""


def group_store() -> ConfigStore:
    """The store, filled with every option."""
    register()
    return GroupStore()


def register() -> None:
    """Store the base config and all group options in dsconf's group store (idempotent)."""
    from dsconf import resolvers

    resolvers.register()
    cs = GroupStore()
    if f"{BASE_CONFIG_NAME}.yaml" in cs.repo:  # stored last: the store is complete
        return
    from omegaconf import OmegaConf

    # The root stays an untyped mapping so a user's primary config can add its own keys next to ours.
    base = OmegaConf.structured({f.name: getattr(DsconfConfig(), f.name) for f in dataclasses.fields(DsconfConfig)})
    # Not in struct mode at the top of `deepspeed`: a dotted override can reach into a section that is still null
    # (deepspeed.tensorboard.enabled=true), and a misspelt key reaches dsconf's validation, which names the key
    # and the closest valid one. Typed sections below it still refuse unknown keys.
    OmegaConf.set_struct(base.deepspeed, False)
    # torchrun's --rdzv-conf is open-ended: dist.rdzv_conf.join_timeout=60 works without a '+'; the launcher checks
    # each key against what torch's rendezvous backends read.
    OmegaConf.set_struct(base.dist.rdzv_conf, False)

    def store(group: str, name: str, node: Any, package: str = DEEPSPEED_NODE) -> None:
        cs.store(group=group, name=name, node=node, package=package, provider=PROVIDER)

    for name, node in PRECISION.items():
        store("precision", name, node)
    for name, node in ZERO.items():
        store("zero", name, node, package=f"{DEEPSPEED_NODE}.zero_optimization")

    store("optimizer", "none", {"optimizer": None})
    # Any other torch.optim class: set its type, add its params with '+deepspeed.optimizer.params.<name>=...'.
    store("optimizer", "torch", {"optimizer": OptimizerConfig(type="???", params={})})
    for name, type_name in OPTIMIZER_OPTIONS.items():
        spec = DEEPSPEED_OPTIMIZERS.get(type_name.lower())
        params = spec.params if spec else TORCH_OPTIMIZER_PARAMS[type_name]
        store("optimizer", name, {"optimizer": optimizer_preset(type_name, params)})

    store("scheduler", "none", {"scheduler": None})
    for name, type_name in SCHEDULER_OPTIONS.items():
        store("scheduler", name, {"scheduler": scheduler_preset(type_name)})

    store("sparse_attention", "none", {"sparse_attention": None})
    for mode, cls in SPARSITY_MODES.items():
        store("sparse_attention", mode, {"sparse_attention": cls()})

    store("activation_checkpointing", "none", {"activation_checkpointing": None})
    for name, node in ACTIVATION_CHECKPOINTING.items():
        store("activation_checkpointing", name, {"activation_checkpointing": node})
    cs.store(name=BASE_CONFIG_NAME, node=base, provider=PROVIDER)


@functools.cache
def option_settings() -> Dict[str, Dict[str, Any]]:
    """'group=option' -> the config that option composes in, as a nested dict from the root (its package
    applied), read back from the group store: what Hydra merges, not a second description of the options.
    Computed once (the store does not change); callers read it and leave it as it is."""
    from omegaconf import OmegaConf

    register()
    store = GroupStore()
    out: Dict[str, Dict[str, Any]] = {}
    for group, options in group_options().items():
        for option in options:
            stored = store.load(f"{group}/{option}.yaml")
            node: Any = OmegaConf.to_container(stored.node, resolve=False)
            for part in reversed((stored.package or "").split(".")):
                node = {part: node} if part else node
            out[f"{group}={option}"] = node
    return out


# What each group configures, and the options whose effect a list of settings would not explain.
GROUP_HELP = {
    "precision": "mixed precision (deepspeed.fp16 / bf16 / amp / torch_autocast)",
    "zero": "ZeRO partitioning and offload (deepspeed.zero_optimization)",
    "optimizer": f"{DEEPSPEED_NODE}.optimizer",
    "scheduler": f"{DEEPSPEED_NODE}.scheduler",
    "sparse_attention": f"{DEEPSPEED_NODE}.sparse_attention",
    "activation_checkpointing": f"{DEEPSPEED_NODE}.activation_checkpointing",
}
_OPTION_NOTES = {
    "precision=fp32": "full precision (no fp16/bf16 section)",
    "optimizer=none": "no optimizer section: pass your own optimizer to deepspeed.initialize",
    "optimizer=torch": "any torch.optim class: set deepspeed.optimizer.type (and its params with '+')",
    "scheduler=none": "no scheduler section",
    "sparse_attention=none": "no sparse attention",
    "activation_checkpointing=none": "no activation checkpointing section",
}


def option_help(group: str, option: str) -> str:
    """One line on what ``group=option`` sets, derived from the option's own definition above."""
    note = _OPTION_NOTES.get(f"{group}={option}")
    if note:
        return note
    if group == "optimizer":
        return f"type={OPTIMIZER_OPTIONS[option]} with DeepSpeed's default params"
    if group == "scheduler":
        return f"type={SCHEDULER_OPTIONS[option]} with DeepSpeed's default params"
    if group == "sparse_attention":
        return f"mode={option} ({SPARSITY_MODES[option].__name__} defaults)"
    if group == "activation_checkpointing":
        node = ACTIVATION_CHECKPOINTING[option]
        changed = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)
                   if getattr(node, f.name) != getattr(type(node)(), f.name)}
        return ", ".join(_settings(changed)) or "DeepSpeed's defaults"
    source = PRECISION if group == "precision" else ZERO
    return ", ".join(_settings(source[option]))


def _settings(node: Dict[str, Any], prefix: str = "") -> list:
    out = []
    for key, value in node.items():
        if isinstance(value, dict):
            out += _settings(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out
