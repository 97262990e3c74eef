"""How schema fields are declared: a default, a one-line description, and optional constraints.

Constraints live in the field's metadata so that validation, documentation, export, ``import`` and the CLI
all read them from the schema, the single source of truth for every key.

A section model may name the DeepSpeed class that parses it in a ``deepspeed_model`` class variable
(``"deepspeed.monitor.config.TensorBoardConfig"``). Such sections are pydantic models in DeepSpeed: they refuse
unknown keys and coerce values in pydantic's lax mode (``"1"`` -> 1, ``"true"`` -> True, ``1e9`` -> an int),
and so does dsconf. Sections without it are read by DeepSpeed as plain dicts (values taken as written).
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, field
from typing import Any, Callable, Optional, Sequence

from dsconf.schema.hf_sources import HF_SOURCES


def doc(
    default: Any = MISSING,
    help: str = "",
    *,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    choices: Optional[Sequence[Any]] = None,
    case_insensitive: bool = False,
    finite: bool = False,
    nonempty: bool = False,
    since: Optional[str] = None,
    until: Optional[str] = None,
    legacy: Optional[str] = None,
    instead: Optional[str] = None,
    aliases: Sequence[str] = (),
    auto: Optional[str] = None,
    type: Any = None,
    model_key: Optional[str] = None,
    models: Optional[Callable[[Any], Optional[type]]] = None,
) -> Any:
    """Declare a schema field.

    ``since``/``until`` bound the DeepSpeed versions that know the key (``until`` is the first version
    that refuses it); ``instead`` is DeepSpeed's advice once it is gone. ``case_insensitive`` marks choices
    DeepSpeed lower-cases before comparing. ``finite``: a number DeepSpeed's validator requires to be finite and
    refuses as a boolean (which lax coercion would otherwise turn into 0/1). ``nonempty``: a string DeepSpeed
    refuses when empty. ``legacy`` names the modern key that replaces this one (a sibling
    key, translated with a warning). ``aliases`` are other spellings DeepSpeed accepts for the same key
    without a warning (exported under the field's own name). ``auto`` names what HF Transformers/Accelerate
    fill an ``"auto"`` value from (e.g. ``"TrainingArguments.learning_rate"``): only such keys accept "auto".
    ``type`` is the value type when the annotation must be ``Any`` (a key that also accepts "auto").
    ``model_key`` marks a dynamic field, whose model depends on the value of that sibling key (optimizer and
    scheduler ``params``: the ``type``); ``models`` maps that value to the model (None: dsconf has none, the
    keys are free-form). Annotate such a field ``Any``.
    """
    if (model_key is None) != (models is None):
        raise TypeError("a dynamic field declares model_key and models together")
    metadata = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": choices,
                "case_insensitive": case_insensitive or None, "finite": finite or None, "nonempty": nonempty or None,
                "since": since,
                "until": until, "legacy": legacy, "instead": instead, "aliases": tuple(aliases) or None,
                "auto": auto, "type": type, "model_key": model_key, "models": models}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    if isinstance(default, (list, dict)) or hasattr(default, "__dataclass_fields__"):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def hf_auto(default: Any, help: str, key: str, type: Any, **constraints: Any) -> Any:
    """A field HF Transformers/Accelerate may leave as "auto": ``key`` is its DeepSpeed key in
    ``hf_sources.HF_SOURCES``, whose entry says what HF fills it from (the field's ``auto`` note).

    Annotate such a field ``Any`` (OmegaConf cannot type a value that is a number or "auto"); ``type`` is
    what validation and ``describe`` use.
    """
    return doc(default, help, auto=str(HF_SOURCES[key]), type=type, **constraints)


def section(model: type, help: str, **metadata: Any) -> Any:
    """A top-level section that is null until the user writes into it (DeepSpeed then applies its defaults).

    Annotate it ``Any``: a typed null node cannot take a dotted override (``deepspeed.tensorboard.enabled=true``
    fails in OmegaConf), and untouched sections then cost composition nothing. Its keys are checked against
    ``model`` by dsconf's validation, which reads the declared type.
    """
    return doc(None, help, type=Optional[model], **metadata)
