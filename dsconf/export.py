"""Export: a composed config node becomes the plain dict DeepSpeed expects, or a ConfigError.

``build_deepspeed_dict`` is the pure core (plain dict in, plain dict out); ``to_deepspeed`` reads a
Hydra/OmegaConf node, finds the world size and the target version, and calls it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, List, Mapping, Optional

from dsconf.batch import BATCH_KEYS, derive_batch
from dsconf.errors import ConfigError, Problem, join_path
from dsconf.resolvers import given_batch_value
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import default_of, fields_of, unwrap_optional
from dsconf.schema.zero import OFFLOAD_BLOCKS
from dsconf.validation import check_model, check_rules, translate_legacy
from dsconf.validation.legacy import translate_legacy_forms
from dsconf.validation.normalize import AUTO, is_auto, normalize
from dsconf.versions import known_in, target_version
from dsconf.world import data_parallel_size

PREFIX = "deepspeed"


def to_deepspeed(cfg: Any, *, world_size: Optional[int] = None, deepspeed_version: Optional[str] = None,
                 keep_auto: Optional[bool] = None, batch_optional: bool = False) -> dict:
    """The validated, plain, JSON-serialisable DeepSpeed dict for a composed config.

    ``cfg`` is dsconf's composed config (with ``deepspeed`` and ``dist``). The data-parallel size comes from
    ``world_size`` (total ranks) if given, else the environment of a running distributed job, else ``cfg.dist``.
    ``keep_auto`` (default: the config's ``keep_auto``) keeps HF's "auto" values for HF Trainer/Accelerate.
    ``batch_optional`` (``dsconf show``): a config that sets neither ``train_batch_size`` nor
    ``train_micro_batch_size_per_gpu`` is exported without the batch keys instead of refused (see ``batch_missing``).
    """
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    if "deepspeed" not in cfg:
        raise ConfigError(Problem(PREFIX, "the config has no 'deepspeed' node",
                                  "list dsconf's base config in the defaults: defaults: [dsconf, _self_]"))
    problems: List[Problem] = []
    raw = plain_deepspeed_node(cfg.deepspeed, problems)
    dist = OmegaConf.to_container(cfg.dist, resolve=True) if "dist" in cfg else None
    try:
        ws = data_parallel_size(dist, sequence_parallel_size=raw.get("sequence_parallel_size"),
                                world_size=world_size, mesh_data_parallel_size=raw.get("data_parallel_size"))
    except ConfigError as err:
        problems.extend(err.problems)
        ws = None
    target = target_version(deepspeed_version or cfg.get("deepspeed_version"))
    keep = bool(cfg.get("keep_auto", False)) if keep_auto is None else keep_auto
    if cfg.get("hf") is not None and keep_auto is None and keep:
        problems.append(Problem("keep_auto", "keep_auto leaves 'auto' for HF to fill in the job, and hf fills it now",
                                "set keep_auto=false to fill at compose time, or hf=null to leave it to HF"))
    if cfg.get("hf") is not None and not keep:
        return _filled_as_hf(cfg, raw, ws, target, problems)
    return build_deepspeed_dict(raw, world_size=ws, target=target, problems=problems, keep_auto=keep,
                                batch_optional=batch_optional)


def batch_missing(ds: Mapping[str, Any]) -> bool:
    """Whether an exported dict lacks the batch size DeepSpeed needs (only ``batch_optional`` exports do)."""
    return "train_batch_size" not in ds


def _filled_as_hf(cfg: Any, raw: Dict[str, Any], ws: Optional[int], target: str, problems: List[Problem]) -> dict:
    """``hf`` set: the dict HF's Trainer would run, "auto" filled from TrainingArguments, then validated."""
    from dsconf.hf_auto import resolve

    with_auto = build_deepspeed_dict(raw, world_size=ws, target=target, problems=problems, keep_auto=True)
    if ws is None:
        raise ConfigError(Problem("dist", "HF fills the batch keys for the job's world size, which is unknown"))
    world = ws * int(raw.get("sequence_parallel_size") or 1)
    return build_deepspeed_dict(resolve(cfg, with_auto, world), world_size=ws, target=target)


def plain_deepspeed_node(node: Any, problems: List[Problem]) -> Dict[str, Any]:
    """The node as plain containers; batch keys hold the user's value, or None when they are to be derived."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    out: Dict[str, Any] = {}
    for key in node.keys():
        try:
            if key in BATCH_KEYS:
                raw = given_batch_value(node._get_node(key)._value())
                out[key] = None if raw is None else node[key]
            else:
                child = node._get_node(key)
                value = OmegaConf.to_container(child, resolve=True) if OmegaConf.is_config(child) else node[key]
                out[key] = value
        except OmegaConfBaseException as err:
            problems.append(Problem(join_path(PREFIX, key), str(err).splitlines()[0]))
    return out


def build_deepspeed_dict(ds: Mapping[str, Any], *, world_size: Optional[int], target: str,
                         problems: Optional[List[Problem]] = None, keep_auto: bool = False,
                         batch_optional: bool = False) -> dict:
    """Validate a plain DeepSpeed dict (DeepSpeed's or dsconf's vocabulary: aliases, legacy keys and values
    DeepSpeed coerces are accepted) and return what DeepSpeed should get, in canonical spellings and types.

    With ``keep_auto`` HF's "auto" values stay for HF Trainer/Accelerate to fill (batch keys that are not
    given become "auto" too), and the batch triple is derived only when none of it is "auto".
    With ``batch_optional``, a dict that gives neither ``train_batch_size`` nor ``train_micro_batch_size_per_gpu``
    is returned without them (what can be shown of it) instead of refused.
    """
    problems = list(problems or [])
    ds = copy.deepcopy(dict(ds))
    batch = {key: ds.pop(key, None) for key in BATCH_KEYS}
    batch = {key: given_batch_value(value) for key, value in batch.items()}
    for key, value in batch.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(Problem(f"{PREFIX}.{key}", f"expected a positive integer or 'auto', got {value!r}"))
    translate_legacy_forms(ds, PREFIX)
    ds = normalize(ds, DeepSpeedConfig, PREFIX, keep_auto=keep_auto, problems=problems)
    check_model(ds, DeepSpeedConfig, PREFIX, target, problems)
    problems.extend(translate_legacy(ds, PREFIX))
    problems.extend(check_rules(ds, structure_ok=not problems))
    left_to_hf = keep_auto and any(value is None for value in batch.values())
    no_batch = (batch_optional and not left_to_hf and batch["train_batch_size"] is None
                and batch["train_micro_batch_size_per_gpu"] is None)
    triple = None
    batch_problem = any(p.path in {f"{PREFIX}.{k}" for k in BATCH_KEYS} for p in problems)
    if world_size is not None and not left_to_hf and not no_batch and not batch_problem:
        try:
            triple = derive_batch(*(batch[k] for k in BATCH_KEYS), world_size, prefix=PREFIX)
        except ConfigError as err:
            problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    if left_to_hf:
        batch_out = {key: AUTO if value is None else value for key, value in batch.items()}
    elif no_batch:
        batch_out = {key: value for key, value in batch.items() if value is not None}
    else:
        assert triple is not None
        batch_out = triple.as_dict()
    out = {**batch_out, **_prune(ds, DeepSpeedConfig, target)}
    fill_dynamic_defaults(out)
    zero = out.get("zero_optimization")
    if isinstance(zero, dict):
        for key in OFFLOAD_BLOCKS:
            if (zero.get(key) or {}).get("device", "none") == "none":
                zero.pop(key, None)
    return out


def fill_dynamic_defaults(ds: Dict[str, Any]) -> None:
    """Write out DeepSpeed's defaults that depend on other keys, so the exported value is the one that runs:
    ``zero_optimization.overlap_comm`` is true only for stage 3."""
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict) and zero.get("overlap_comm") is None and not is_auto(zero.get("stage")):
        zero["overlap_comm"] = zero.get("stage", 0) == 3


def _prune(value: Any, cls: Optional[type], target: str) -> Any:
    """Drop nulls, and keys the target version does not know that still hold their default."""
    if isinstance(value, dict):
        fields = fields_of(cls) if cls is not None and dataclasses.is_dataclass(cls) else {}
        out = {}
        for key, item in value.items():
            if item is None:
                continue
            sub_cls = None
            if key in fields:
                tp, field = fields[key]
                meta = field.metadata
                if not known_in(target, meta.get("since"), meta.get("until")) and item == default_of(field):
                    continue
                inner, _ = unwrap_optional(tp)
                sub_cls = inner if dataclasses.is_dataclass(inner) else None
            out[key] = _prune(item, sub_cls, target)
        return out
    if isinstance(value, list):
        return [_prune(v, None, target) for v in value]
    return value
