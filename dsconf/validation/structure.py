"""Checking a plain config dict against the schema: unknown keys, types, ranges, choices, required values,
and keys the target DeepSpeed version does not know.

Everything is read from the schema fields' metadata; no rule about a single key lives here.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any, Dict, List, Optional

from dsconf.errors import Problem, did_you_mean, join_path
from dsconf.schema.introspect import default_of, dynamic_model, fields_of, model_key, model_node, unwrap_optional
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, OptimizerConfig
from dsconf.schema.sparse_attention import SPARSITY_MODES
from dsconf.validation.normalize import deepspeed_auto, is_auto
from dsconf.versions import at_least, known_in

MISSING_VALUE = "???"
MAX_GRAD_NORM = "max_grad_norm"  # refused in optimizer params by DeepSpeed's engine: see rules
SPARSE_ATTENTION = "sparse_attention"  # its model is its mode's (dynamic_model)


def check_model(value: Any, cls: type, path: str, target: str, problems: List[Problem]) -> None:
    """Append to ``problems`` everything in ``value`` (a dict) that ``cls`` does not allow."""
    if not isinstance(value, dict):
        problems.append(Problem(path, f"expected a section ({cls.__name__}), got {value!r}"))
        return
    fields = fields_of(cls)
    for key in value:
        if key not in fields:
            problems.append(unknown_key(cls, fields, path, key, value[key]))
    for name, (tp, field) in fields.items():
        if name in value:
            check_field(value[name], tp, field, cls, value, join_path(path, name), target, problems)


def unknown_key(cls: type, fields: typing.Mapping[str, Any], path: str, key: Any, value: Any) -> Problem:
    """An unknown key: DeepSpeed's pydantic sections refuse it; everywhere else DeepSpeed silently ignores it."""
    message = "unknown key" if getattr(cls, "deepspeed_model", None) else "unknown key: DeepSpeed ignores it"
    inner = [k for k in value if k in fields] if isinstance(value, dict) else []
    if inner:  # a wrapper such as {"monitor_config": {"csv_monitor": ...}}
        where = path if "." in path else "the top level"
        return Problem(join_path(path, key), message, f"DeepSpeed reads {', '.join(map(str, inner))} at {where}: "
                       f"move {'them' if len(inner) > 1 else 'it'} out of {key}")
    if str(key).startswith(("_", "//", "#")) or "comment" in str(key).lower():
        return Problem(join_path(path, key), message, "remove it; DeepSpeed reads config files as hjson, so a "
                       "file can hold // comments instead")
    return Problem(join_path(path, key), message, did_you_mean(str(key), fields))


def check_field(value: Any, tp: Any, field: dataclasses.Field, owner: type, parent: dict, path: str, target: str,
                problems: List[Problem]) -> None:
    meta = field.metadata
    if is_auto(value) and not deepspeed_auto(field):
        return  # HF's "auto" was judged when the config was normalized
    if isinstance(value, str) and value == MISSING_VALUE:
        problems.append(Problem(path, "is required but has no value", f"set {path}=<value>"))
        return
    if not known_in(target, meta.get("since"), meta.get("until")) and value is not None \
            and value != default_of(field):
        if meta.get("since") and not at_least(target, meta["since"]):
            problems.append(Problem(path, f"needs DeepSpeed >= {meta['since']} (target is {target})",
                                    f"remove it or set deepspeed_version={meta['since']}"))
        else:
            instead = meta.get("instead") or "remove it"
            problems.append(Problem(path, f"was removed in DeepSpeed {meta['until']} (target is {target})", instead))
        return
    inner, optional = unwrap_optional(tp)
    if value is None:
        if not optional and inner is not Any:
            problems.append(Problem(path, "must not be null", f"expected {_type_label(inner)}"))
        return
    if inner is Any:
        model = dynamic_model(owner, field.name, model_node(field, value, parent))
        if model is not None:
            check_dynamic(value, model, owner, field.name, parent, path, target, problems)
        elif field.name == SPARSE_ATTENTION and isinstance(value, dict):  # a mode that has no model
            problems.append(Problem(join_path(path, "mode"), f"unknown sparsity mode {value.get('mode')!r}",
                                    did_you_mean(str(value.get("mode")), SPARSITY_MODES)))
        elif model_key(field) and not isinstance(value, dict):  # free-form params: keyword arguments
            problems.append(Problem(path, f"expected a section (keyword arguments), got {value!r}"))
        return
    if dataclasses.is_dataclass(inner):
        check_model(value, inner, path, target, problems)
        return
    if not _type_ok(value, inner):
        problems.append(Problem(path, f"expected {_type_label(inner)}, got {value!r}"))
        return
    _check_constraints(value, inner, meta, path, problems)


def check_dynamic(value: Any, model: type, owner: type, name: str, parent: dict, path: str, target: str,
                  problems: List[Problem]) -> None:
    """A field typed ``Any`` whose model ``dynamic_model`` read from a value: a section typed by its name (optimizer,
    scheduler), the sparsity mode's model, or a dynamic field's (declared ``model_key``: the optimizer's and the
    scheduler's ``params``, whose model the sibling ``type`` picks). The optimizer also gets the checks of its type."""
    if model in SPARSITY_MODES.values():
        mode = value.get("mode", "fixed") if isinstance(value, dict) else None
        if mode not in SPARSITY_MODES:
            problems.append(Problem(join_path(path, "mode"), f"unknown sparsity mode {mode!r}",
                                    did_you_mean(str(mode), SPARSITY_MODES)))
            return
    if model is OptimizerConfig:
        params = value.get("params") if isinstance(value, dict) else None
        if isinstance(params, dict) and MAX_GRAD_NORM in params:  # a rule of its own says what to do instead
            value = {**value, "params": {k: v for k, v in params.items() if k != MAX_GRAD_NORM}}
    check_model(value, model, path, target, problems)
    if model is OptimizerConfig and isinstance(value, dict):
        check_optimizer_type(value, path, target, problems)


def check_optimizer_type(value: dict, path: str, target: str, problems: List[Problem]) -> None:
    type_name = value.get("type")
    params = value.get("params") or {}
    if not isinstance(type_name, str):
        return
    spec = DEEPSPEED_OPTIMIZERS.get(type_name.lower())
    if spec is not None:
        if not known_in(target, None, spec.until):
            problems.append(Problem(join_path(path, "type"),
                                    f"{spec.type} is not built into DeepSpeed {spec.until}+ (target is {target})",
                                    "use Adam, AdamW or Lamb, or set deepspeed_version to an older release"))
        return
    if dynamic_model(OptimizerConfig, "params", value) is not None:
        return  # a torch.optim class with a typed preset, checked by the schema walk
    optimizer_class = _torch_optimizer(type_name)
    if optimizer_class is None:
        names = [s.type for s in DEEPSPEED_OPTIMIZERS.values()] + _torch_optimizer_names()
        problems.append(Problem(join_path(path, "type"),
                                f"unknown optimizer {type_name!r}: neither a DeepSpeed optimizer nor torch.optim."
                                f"{type_name}", did_you_mean(type_name, names)))
        return
    if isinstance(params, dict):
        accepted = [p for p in inspect.signature(optimizer_class).parameters if p not in ("self", "params")]
        for key in params:
            if key not in accepted:
                problems.append(Problem(join_path(path, "params", key),
                                        f"torch.optim.{type_name} takes no argument {key!r}",
                                        did_you_mean(str(key), accepted)))


def _torch_optimizer(name: str) -> Optional[type]:
    import torch.optim

    candidate = getattr(torch.optim, name, None)
    if inspect.isclass(candidate) and issubclass(candidate, torch.optim.Optimizer):
        return candidate
    return None


def _torch_optimizer_names() -> List[str]:
    import torch.optim

    return [n for n, c in vars(torch.optim).items() if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer)]


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return any(_type_ok(value, member) for member in typing.get_args(tp))
    if origin in (dict, Dict):
        return isinstance(value, dict)
    if origin in (list, List):
        (item,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True


def _type_label(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return " or ".join(_type_label(member) for member in typing.get_args(tp))
    if origin in (dict, Dict):
        return "a section"
    if origin in (list, List):
        (item,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_label(item)}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _check_constraints(value: Any, tp: Any, meta: typing.Mapping[str, Any], path: str, problems: List[Problem]
                       ) -> None:
    """``tp``: the value's type; in a Union of text and numbers, choices constrain the text and bounds the numbers."""
    if meta.get("finite") and isinstance(value, float) and not math.isfinite(value):
        problems.append(Problem(path, f"{value!r} is not a finite number", "give a finite number"))
        return
    if meta.get("nonempty") and value == "":
        problems.append(Problem(path, "must not be empty", "give a value, or remove the key for its default"))
        return
    choices = meta.get("choices")
    if typing.get_origin(tp) is typing.Union and not isinstance(value, str):
        choices = None
    if choices is not None:
        probe = value.lower() if meta.get("case_insensitive") and isinstance(value, str) else value
        if probe not in choices:
            problems.append(Problem(path, f"{value!r} is not allowed",
                                    "allowed: " + ", ".join(repr(c) for c in choices)))
            return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for bound, test, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                                  ("le", lambda v, b: v <= b, "<=")):
            if bound in meta and not test(value, meta[bound]):
                problems.append(Problem(path, f"{value!r} is out of range", f"must be {word} {meta[bound]}"))
