"""Reading the schema: resolved field types, descriptions, and the model that describes a dotted path."""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from typing import Any, Dict, List, Optional, Tuple

from dsconf.schema.optimizer import OptimizerConfig
from dsconf.schema.precision import BF16Config
from dsconf.schema.root import DsconfConfig
from dsconf.schema.scheduler import SchedulerConfig
from dsconf.schema.sparse_attention import SPARSITY_MODES


@cache
def fields_of(cls: type) -> Dict[str, Tuple[Any, dataclasses.Field]]:
    """name -> (resolved type, Field) for a schema dataclass; a field's declared ``type`` overrides an ``Any``
    annotation (keys that also accept HF's "auto")."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f.metadata.get("type", hints[f.name]), f) for f in dataclasses.fields(cls)
            if f.name != "defaults"}


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    """(inner type, whether None is allowed)."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def model_key(field: dataclasses.Field) -> Optional[str]:
    """The sibling key whose value picks a dynamic field's model (declared ``model_key``: ``type`` for the optimizer's
    and the scheduler's ``params``); None for any other field."""
    return field.metadata.get("model_key")


def model_node(field: dataclasses.Field, value: Any, parent: Any) -> Any:
    """The node ``dynamic_model`` reads a field's model from: the parent (which holds the sibling key) for a dynamic
    field, else the field's own value."""
    return parent if model_key(field) else value


@cache
def model_keys() -> Dict[str, str]:
    """section of ``deepspeed`` -> the key in it that picks a dynamic field's model (``{"optimizer": "type",
    "scheduler": "type"}``), read from the fields' declarations: the sections ``walk``'s ``types`` are keyed by."""
    from dsconf.schema.deepspeed import DeepSpeedConfig

    out = {}
    for name, (tp, _) in fields_of(DeepSpeedConfig).items():
        inner, _ = unwrap_optional(tp)
        model = inner if dataclasses.is_dataclass(inner) else dynamic_model(DeepSpeedConfig, name, {})
        for _, field in fields_of(model).values() if model is not None else ():
            if model_key(field):
                out[name] = model_key(field)
    return out


def dynamic_model(owner: type, name: str, value: Any) -> Optional[type]:
    """The model for a field typed ``Any`` whose shape depends on its value (optimizer, scheduler, ...).

    For a dynamic field (declared with ``model_key``: the optimizer's and the scheduler's ``params``), ``value`` is
    its parent's node (``model_node``), whose sibling key the field's declared ``models`` maps to the model.
    """
    from dsconf.schema.deepspeed import DeepSpeedConfig

    declared = fields_of(owner).get(name) if dataclasses.is_dataclass(owner) else None
    key = model_key(declared[1]) if declared else None
    if key:
        return declared[1].metadata["models"](value.get(key) if isinstance(value, dict) else "")
    if owner is DeepSpeedConfig and name == "optimizer":
        return OptimizerConfig
    if owner is DeepSpeedConfig and name == "scheduler":
        return SchedulerConfig
    if owner is DeepSpeedConfig and name == "bfloat16":
        return BF16Config
    if owner is DeepSpeedConfig and name == "sparse_attention":
        mode = value.get("mode", "fixed") if isinstance(value, dict) else "fixed"
        return SPARSITY_MODES.get(mode) if isinstance(mode, str) else None
    return None


@dataclasses.dataclass(frozen=True)
class Step:
    """One resolved part of a dotted path: the field, its owner, and the model of its value (None: a leaf, or
    a free-form node)."""

    name: str  # the field's own name
    written: str  # the part as written: the name, or one of the field's aliases
    owner: type
    type: Any
    field: dataclasses.Field
    model: Optional[type]


def walk(path: str, root: type = DsconfConfig, types: Optional[Dict[str, Optional[str]]] = None) -> List[Step]:
    """The fields along a dotted path, as far as the schema knows them (fewer steps than parts: the first part
    left over is unknown). Aliases resolve to the field they spell.

    ``types`` names what decides a dynamic model: the value of a dynamic field's ``model_key`` by section (the
    optimizer/scheduler type, for their ``params``: ``model_keys()``) and the sparsity mode (``sparse_attention``),
    as ``composition.chosen_types`` reads them from overrides.
    """
    types = types or {}
    steps: List[Step] = []
    cls: Optional[type] = root
    for part in [p for p in path.split(".") if p]:
        name = field_name(cls, part) if cls is not None else None
        if cls is None or name is None:
            break
        tp, field = fields_of(cls)[name]
        inner, _ = unwrap_optional(tp)
        section = steps[-1].name if steps else ""
        # the node a dynamic model is read from: for a dynamic field its parent (the sibling key), else the section
        key = model_key(field)
        value = {key: types.get(section) or ""} if key else ({"mode": types[name]} if types.get(name) else {})
        model = inner if dataclasses.is_dataclass(inner) else dynamic_model(cls, name, value)
        steps.append(Step(name, part, cls, tp, field, model))
        cls = model
    return steps


def field_name(cls: type, part: str) -> Optional[str]:
    """The field ``part`` names in ``cls``: itself, or the field that has it as an alias."""
    fields = fields_of(cls)
    if part in fields:
        return part
    return next((name for name, (_, f) in fields.items() if part in (f.metadata.get("aliases") or ())), None)


def model_at(path: str, root: type = DsconfConfig, types: Optional[Dict[str, Optional[str]]] = None
             ) -> Optional[type]:
    """The schema model describing the node at a dotted path (None where it is free-form or unknown)."""
    parts = [p for p in path.split(".") if p]
    steps = walk(path, root, types)
    if len(steps) < len(parts):
        return None
    return steps[-1].model if steps else root


def describe(path: str = "", root: type = DsconfConfig, types: Optional[Dict[str, Optional[str]]] = None
             ) -> Dict[str, str]:
    """key -> 'type = default  # description' for every field of the model at ``path``."""
    cls = model_at(path, root, types=types)
    if cls is None:
        return {}
    out = {}
    for name, (tp, field) in fields_of(cls).items():
        default = default_of(field)
        shown = "(section)" if dataclasses.is_dataclass(default) else repr(default)
        notes = field_notes(field.metadata)
        extra = f" [{'; '.join(notes)}]" if notes else ""
        out[name] = f"{type_name(tp)} = {shown}  # {field.metadata.get('help', '')}{extra}"
    return out


def field_notes(meta: typing.Mapping[str, Any]) -> List[str]:
    """The short notes a key's listing carries after its description (HF 'auto', versions, spellings)."""
    notes = [f"'auto': filled by HF from {meta['auto']}"] if meta.get("auto") else []
    notes += [f"since DeepSpeed {meta['since']}"] if meta.get("since") else []
    notes += [f"removed in DeepSpeed {meta['until']}"] if meta.get("until") else []
    notes += [f"also spelt {', '.join(meta['aliases'])}"] if meta.get("aliases") else []
    notes += [f"deprecated: use {meta['legacy']}"] if meta.get("legacy") else []
    return notes


def type_name(tp: Any) -> str:
    inner, optional = unwrap_optional(tp)
    if typing.get_origin(inner) is typing.Union:
        return " | ".join(type_name(a) for a in typing.get_args(inner))
    name = getattr(inner, "__name__", None) or str(inner).replace("typing.", "")
    return f"{name} | null" if optional else name


def with_defaults(value: Any, cls: Optional[type]) -> Any:
    """``value`` with every key its model declares filled with the schema's (DeepSpeed's) default; sections that
    are null by default stay absent. Two configs that mean the same thing to DeepSpeed are equal this way."""
    if not isinstance(value, dict) or cls is None or not dataclasses.is_dataclass(cls):
        return value
    out = dict(value)
    for name, (tp, field) in fields_of(cls).items():
        inner, _ = unwrap_optional(tp)
        if name not in out:
            default = default_of(field)
            if default is None or default is dataclasses.MISSING:
                continue
            out[name] = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        sub = inner if dataclasses.is_dataclass(inner) else dynamic_model(cls, name, model_node(field, out[name], out))
        out[name] = with_defaults(out[name], sub)
    return out
