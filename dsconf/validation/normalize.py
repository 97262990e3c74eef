"""Spellings and values DeepSpeed accepts, brought to one canonical form before anything else reads them.

- Aliases (``prefetch_bucket_size`` for ``stage3_prefetch_bucket_size``) become the field's own name; giving
  both is a conflict, as it is for DeepSpeed.
- In sections DeepSpeed parses with a pydantic model (``deepspeed_model`` on the schema class), values are
  coerced as pydantic's lax mode does (``"1"`` -> 1, ``"true"`` -> True, ``5e8`` -> 500000000), so what is
  exported has the type DeepSpeed would have turned it into.
- In keys DeepSpeed reads from the plain dict (``get_scalar_param``: the top level and the dict-parsed sections),
  DeepSpeed uses the value as written, so an integral float runs where an integer is meant (``1e5``) and 0/1 where
  a boolean is (its truth value): those become ``100000`` and ``true``. Anything else keeps its type and is
  judged by the schema check.
- HF's ``"auto"`` is legal in keys HF Transformers/Accelerate fill (``auto`` in the field's metadata). With
  ``keep_auto`` it stays (the config goes to HF, which fills it); without, it is a problem that says where HF
  would take the value from and how to give it in Hydra. In any other key of a pydantic section DeepSpeed drops
  "auto" and uses its default: so does dsconf, with a warning naming that default. In a dict-parsed key DeepSpeed
  would get the string "auto": a problem.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from typing import Any, Dict, List, Optional

from dsconf.errors import ConfigWarning, Problem, join_path
from dsconf.resolvers import AUTO
from dsconf.schema.introspect import dynamic_model, fields_of, model_key, model_node, unwrap_optional

_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
_NOT_COERCED = object()


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


def auto_source(field: dataclasses.Field) -> Optional[str]:
    """What HF Transformers/Accelerate fill an "auto" value of this field from (None: "auto" is not legal)."""
    return field.metadata.get("auto")


def coerce(value: Any, tp: Any) -> Any:
    """``value`` as pydantic's lax mode turns it into ``tp``, or ``_NOT_COERCED`` (left for the type check)."""
    inner, optional = unwrap_optional(tp)
    if value is None:
        return None if optional else _NOT_COERCED
    origin = typing.get_origin(inner)
    if origin is typing.Union:  # pydantic's smart mode: a member of the value's type wins, else the first that takes it
        members = [m for m in typing.get_args(inner) if m is not type(None)]
        if any(type(value) is m for m in members):
            return value
        return next((c for c in (coerce(value, m) for m in members) if c is not _NOT_COERCED), _NOT_COERCED)
    if origin in (list, List):
        (item,) = typing.get_args(inner) or (Any,)
        if not isinstance(value, (list, tuple)):
            return _NOT_COERCED
        items = [coerce(v, item) for v in value]
        return _NOT_COERCED if any(i is _NOT_COERCED for i in items) else items
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        return _NOT_COERCED
    if inner is int:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value.strip()) if "." in value else int(value.strip())
            except ValueError:
                return _NOT_COERCED
            return int(number) if float(number).is_integer() and "e" not in value.lower() else _NOT_COERCED
        return _NOT_COERCED
    if inner is float:
        if isinstance(value, (bool, int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                return _NOT_COERCED
        return _NOT_COERCED
    return value if inner is not str or isinstance(value, str) else _NOT_COERCED


def plain_number(value: Any, tp: Any) -> Any:
    """``value`` as DeepSpeed means it in a key it reads from the plain dict, or ``_NOT_COERCED``: an integral float
    where an integer is expected (``1e5`` -> 100000), 0 or 1 where a boolean is (DeepSpeed uses its truth value)."""
    inner, _ = unwrap_optional(tp)
    members = typing.get_args(inner) if typing.get_origin(inner) is typing.Union else (inner,)
    if int in members and float not in members and isinstance(value, float) and value.is_integer():
        return int(value)
    if members == (bool,) and type(value) is int and value in (0, 1):
        return bool(value)
    return _NOT_COERCED


class AutoDroppedWarning(ConfigWarning):
    """"auto" in a key of a pydantic section that HF does not fill: DeepSpeed drops it and uses its default."""


def normalize(value: Any, cls: type, path: str, *, keep_auto: bool, problems: List[Problem]) -> Any:
    """Canonical names and values for a section dict of model ``cls`` (a new dict; ``value`` is not changed)."""
    if not isinstance(value, dict):
        return value
    fields = fields_of(cls)
    aliases = {alias: name for name, (_, f) in fields.items() for alias in f.metadata.get("aliases", ())}
    lax = bool(getattr(cls, "deepspeed_model", None))
    out: Dict[str, Any] = {}
    for key, item in value.items():
        name = aliases.get(key, key)
        if name != key and (name in value or name in out):
            problems.append(Problem(join_path(path, key), f"is another spelling of {name}, which is also given",
                                    f"keep only {join_path(path, name)}"))
            continue
        out[name] = item
    for name, item in list(out.items()):
        if name not in fields:
            continue
        tp, field = fields[name]
        out[name] = _normalize_field(item, tp, field, cls, out, join_path(path, name), keep_auto, lax, problems)
    return out


def deepspeed_auto(field: dataclasses.Field) -> bool:
    """Whether "auto" is DeepSpeed's own value for this key (its default), not one HF fills."""
    return is_auto(field.default) or AUTO in (field.metadata.get("choices") or ())


def _normalize_field(value: Any, tp: Any, field: dataclasses.Field, owner: type, parent: dict, path: str,
                     keep_auto: bool, lax: bool, problems: List[Problem]) -> Any:
    if is_auto(value) and not deepspeed_auto(field):
        if auto_dropped(field, lax):
            warnings.warn(f"{path}='auto' is no value DeepSpeed reads here: DeepSpeed drops it and uses its default "
                          f"{_shown(field.default)}, which dsconf exports", AutoDroppedWarning, stacklevel=2)
            return field.default
        _judge_auto(auto_source(field), path, keep_auto, problems)
        return value
    inner, _ = unwrap_optional(tp)
    if dataclasses.is_dataclass(inner):
        return normalize(value, inner, path, keep_auto=keep_auto, problems=problems)
    if inner is Any:
        model = dynamic_model(owner, field.name, model_node(field, value, parent))
        if model is not None:
            return normalize(value, model, path, keep_auto=keep_auto, problems=problems)
        if model_key(field) and isinstance(value, dict):
            _free_form_auto(value, hf_filled_params(owner), path, keep_auto, problems)
        return value
    if isinstance(value, bool) and field.metadata.get("finite"):
        return value  # DeepSpeed's validator refuses a boolean before pydantic would make it 0/1
    coerced = coerce(value, tp) if lax else plain_number(value, tp)
    return value if coerced is _NOT_COERCED else coerced


def _shown(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def auto_dropped(field: dataclasses.Field, lax: bool) -> bool:
    """"auto" in a key of a pydantic section (``lax``) that HF does not fill: DeepSpeedConfigModel (non-strict) drops
    every "auto" before validation, so the field gets its default."""
    return lax and auto_source(field) is None and not deepspeed_auto(field) and field.default is not dataclasses.MISSING


def hf_filled_params(owner: type) -> Dict[str, str]:
    """What HF fills an "auto" param of ``owner``'s free-form params from (the optimizer's or the scheduler's)."""
    from dsconf.schema import optimizer, scheduler

    return {optimizer.OptimizerConfig: optimizer.HF_FILLED_PARAMS,
            scheduler.SchedulerConfig: scheduler.HF_FILLED_PARAMS}.get(owner, {})


def _free_form_auto(params: Dict[str, Any], filled: Dict[str, str], path: str, keep_auto: bool,
                    problems: List[Problem]) -> None:
    """"auto" in the params of an optimizer or scheduler dsconf has no model for (any torch.optim class)."""
    for key, item in params.items():
        if is_auto(item):
            _judge_auto(filled.get(key), join_path(path, key), keep_auto, problems)


def _judge_auto(source: Optional[str], path: str, keep_auto: bool, problems: List[Problem]) -> None:
    if source is None:
        problems.append(Problem(path, "'auto' is not a value here: HF Transformers/Accelerate fill 'auto' only in "
                                "the keys they derive, and DeepSpeed would get the string 'auto'", "set a value"))
    elif not keep_auto:
        problems.append(Problem(path, f"'auto' is filled by HF Trainer/Accelerate (from {source}), not by DeepSpeed",
                                f"set a value ({path}=<value>, or a Hydra interpolation such as ${{my.value}}), or "
                                "keep_auto=true / --keep-auto when the config goes to HF Trainer/Accelerate"))

