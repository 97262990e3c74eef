"""``dsconf schema``: a JSON Schema (draft 2020-12) of DeepSpeed's config file, for editors.

Everything comes from the schema fields' metadata, the facts ``dsconf validate`` checks, read the way validation
reads them: types with the coercions DeepSpeed applies (pydantic's lax mode in the sections it parses with pydantic,
integral floats and 0/1 in the keys it reads from the plain dict), choices, ranges, defaults, aliases, deprecated
keys, HF's "auto" where HF Transformers/Accelerate fill it (and where DeepSpeed drops it for its default), the keys
the target DeepSpeed version does not know, optimizer and scheduler ``params`` by ``type`` and sparse attention by
``mode``. Cross-field rules (fp16 with bf16, the batch arithmetic, ...) are beyond a schema: ``dsconf validate``
checks them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from typing import Any, Dict, List, Optional, Tuple

from dsconf.batch import BATCH_KEYS
from dsconf.schema import optimizer
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.hf_sources import HF_SOURCES
from dsconf.schema.introspect import default_of, dynamic_model, field_notes, fields_of, model_key, unwrap_optional
from dsconf.schema.scheduler import REQUIRED
from dsconf.schema.sparse_attention import SPARSITY_MODES
from dsconf.validation.normalize import _FALSE, _TRUE, auto_dropped, auto_source, deepspeed_auto, hf_filled_params
from dsconf.validation.structure import MAX_GRAD_NORM
from dsconf.versions import at_least, known_in, newer_than_known, target_version

DIALECT = "https://json-schema.org/draft/2020-12/schema"
AUTO = "auto"

# Regular expressions (ECMA-262 and Python alike) for the text pydantic's lax mode turns into a number or a boolean,
# as ``normalize.coerce`` reads it: Python's int()/float() syntax, underscores between digits included.
_DIGITS = r"\d(?:_?\d)*"
_ZEROS = r"0(?:_?0)*"
_FRACTION_ZERO = rf"(?:\.(?:{_ZEROS})?)?"


def _escape(word: str) -> str:
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in word)


def _letters(word: str) -> str:
    """``word`` as a case-insensitive pattern ("[aA][uU][tT][oO]")."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else _escape(c) for c in word)


def _one_of(words: typing.Iterable[str], case_insensitive: bool) -> str:
    """A pattern matching exactly one of ``words``."""
    return "^(?:" + "|".join(_letters(w) if case_insensitive else _escape(w) for w in words) + ")$"


INT_TEXT = rf"^\s*[+-]?(?:{_DIGITS}{_FRACTION_ZERO}|\.{_ZEROS})\s*$"
FINITE_TEXT = rf"^\s*[+-]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?\s*$"
FLOAT_TEXT = rf"{FINITE_TEXT}|^\s*[+-]?(?:{_letters('nan')}|{_letters('inf')}(?:{_letters('inity')})?)\s*$"
BOOL_TEXT = _one_of(sorted(_TRUE | _FALSE), case_insensitive=True)
# Under $defs, shared by every key of a pydantic section.
TEXT_DEFS = {
    "BooleanText": {"type": "string", "pattern": BOOL_TEXT, "description": "text DeepSpeed reads as a boolean"},
    "IntegerText": {"type": "string", "pattern": INT_TEXT, "description": "text DeepSpeed reads as an integer"},
    "NumberText": {"type": "string", "pattern": FLOAT_TEXT, "description": "text DeepSpeed reads as a number"},
    "FiniteNumberText": {"type": "string", "pattern": FINITE_TEXT,
                         "description": "text DeepSpeed reads as a finite number"},
}
# The metadata of ``_field.doc`` the schema states (help, constraints, versions, spellings, "auto", the value's
# model): a key declared with another is a fact the schema would miss (tests/test_json_schema.py checks).
EXPRESSED = frozenset({"help", "ge", "gt", "le", "choices", "case_insensitive", "finite", "nonempty", "since", "until",
                       "legacy", "instead", "aliases", "auto", "type", "model_key", "models"})
# what ``given_batch_value`` reads as "derive this batch key": "auto" in any case, or dsconf's own resolver
BATCH_DERIVED = rf"^\s*{_letters(AUTO)}\s*$|^\$\{{dsconf\.batch"


def json_schema(deepspeed_version: Optional[str] = None) -> Dict[str, Any]:
    """The JSON Schema of a DeepSpeed config file for the target version (default: the installed DeepSpeed's)."""
    target = target_version(deepspeed_version)
    builder = _Builder(target)
    root = builder.object_schema(DeepSpeedConfig)
    note = newer_than_known(target)
    return {"$schema": DIALECT, "title": f"DeepSpeed config (DeepSpeed {target})",
            "description": f"DeepSpeed's JSON config for DeepSpeed {target}{f' ({note})' if note else ''}. Generated "
                           "by `dsconf schema`; cross-field rules (fp16 with bf16, the batch arithmetic, ...) are "
                           "checked by `dsconf validate`, not here.",
            "type": "object", **root, "$defs": dict(sorted({**builder.defs, **TEXT_DEFS}.items()))}


class _Builder:
    def __init__(self, target: str) -> None:
        self.target = target
        self.defs: Dict[str, Any] = {}
        self.names: Dict[type, str] = {}

    def ref(self, cls: type) -> Dict[str, Any]:
        """A section of model ``cls``: an object, checked by the model's definition."""
        return {**self.definition(cls), "type": "object"}

    def definition(self, cls: type) -> Dict[str, Any]:
        """A reference to the model's schema under $defs, built on first use. The definition constrains objects
        only (no "type"): each use says which other values the key takes (null, "auto", ...)."""
        if cls not in self.names:
            name = cls.__name__ if cls.__name__ not in self.defs else f"{cls.__module__}.{cls.__name__}"
            self.names[cls] = name
            self.defs[name] = {}  # reserved: a model may refer to itself
            self.defs[name] = self.object_schema(cls)
        return {"$ref": f"#/$defs/{self.names[cls]}"}

    def object_schema(self, cls: type) -> Dict[str, Any]:
        properties: Dict[str, Any] = {}
        conflicts: Dict[str, Any] = {}
        dispatch: List[Dict[str, Any]] = []
        for name, (tp, field) in fields_of(cls).items():
            properties[name] = self.field_schema(cls, name, tp, field)
            for alias in field.metadata.get("aliases", ()):
                properties[alias] = {**properties[name], "description": f"Another spelling of {name}, which "
                                     f"DeepSpeed reads the same (give one of them). {properties[name]['description']}"}
                conflicts[alias] = {"not": {"required": [name]}}
            if model_key(field):
                dispatch += self.params_by_type(cls, name, field)
        out: Dict[str, Any] = {}
        doc = inspect.getdoc(cls) or ""
        if doc and not doc.startswith(cls.__name__ + "("):  # not the signature dataclass writes when there is none
            out["description"] = doc.split("\n\n")[0].replace("\n", " ")
        out.update(properties=properties, additionalProperties=False)
        if conflicts:
            out["dependentSchemas"] = conflicts
        if dispatch:
            out["allOf"] = dispatch
        return out

    def field_schema(self, owner: type, name: str, tp: Any, field: dataclasses.Field) -> Dict[str, Any]:
        meta = field.metadata
        lax = bool(getattr(owner, "deepspeed_model", None))
        if owner is DeepSpeedConfig and name in BATCH_KEYS:
            return {"description": _description(meta), **self.batch_key(name)}
        auto, note = None, ""
        if auto_source(field):
            auto = {"const": AUTO, "description": f"filled by HF from {auto_source(field)}"}
        elif auto_dropped(field, lax):
            note = f"'auto': DeepSpeed uses its default {_shown(field.default)}"
            auto = {"const": AUTO, "description": f"DeepSpeed drops 'auto' here and uses its default "
                                                  f"{_shown(field.default)}"}
        out: Dict[str, Any] = {"description": _description(meta, note)}
        if not known_in(self.target, meta.get("since"), meta.get("until")):
            return {**out, **self.gated(tp, field, lax, auto)}
        value, nullable = self.value_schema(owner, name, tp, field, lax)
        others = ([{"type": "null"}] if nullable else []) + ([auto] if auto else [])
        if owner is DeepSpeedConfig and name == "zero_optimization":  # validation.legacy.translate_legacy_forms
            others.append({"type": "boolean"})
            out["description"] += " (DeepSpeed's old form true/false means stage 1/0)"
        out.update(_either(value, others))
        refused = []
        if auto is None and not deepspeed_auto(field) and _takes_text(tp):
            refused.append({"const": AUTO, "description": "'auto' is no value here: DeepSpeed would get the text"})
        if owner is optimizer.OptimizerConfig and name == "type":
            out["examples"] = self.optimizer_names()
            refused += self.gone_optimizers()
        if refused:
            out["not"] = _any_of(refused)
        default = _json_default(field)
        if default is not dataclasses.MISSING:
            out["default"] = default
        if meta.get("legacy"):
            out.update(deprecated=True, deprecationMessage=f"Deprecated: use {meta['legacy']} (dsconf translates it)")
        return out

    def gated(self, tp: Any, field: dataclasses.Field, lax: bool, auto: Optional[dict]) -> Dict[str, Any]:
        """A key the target version does not know: validation lets only null or its default through."""
        meta = field.metadata
        if meta.get("since") and not at_least(self.target, meta["since"]):
            why = f"Needs DeepSpeed >= {meta['since']} (the target is {self.target})"
        else:
            why = (f"Removed in DeepSpeed {meta['until']} (the target is {self.target}): "
                   f"{meta.get('instead') or 'remove it'}")
        nullable = unwrap_optional(tp)[1] or unwrap_optional(tp)[0] is Any
        branches = [{"type": "null"}] * nullable + _equal_to(default_of(field), tp, lax) + ([auto] if auto else [])
        return {**_any_of(branches), "deprecated": True, "deprecationMessage": why}

    def optimizer_names(self) -> List[str]:
        """DeepSpeed's optimizers the target builds (in any case; any torch.optim class is valid too, which only
        validation can look up)."""
        return [s.type for s in optimizer.DEEPSPEED_OPTIMIZERS.values() if known_in(self.target, None, s.until)]

    def gone_optimizers(self) -> List[Dict[str, Any]]:
        """DeepSpeed's optimizers the target no longer builds (``structure.check_optimizer_type``)."""
        gone = [s.type for s in optimizer.DEEPSPEED_OPTIMIZERS.values() if not known_in(self.target, None, s.until)]
        return [{"type": "string", "pattern": _one_of(gone, case_insensitive=True),
                 "description": f"not built into DeepSpeed {self.target}"}] if gone else []

    def batch_key(self, name: str) -> Dict[str, Any]:
        """A batch key: a positive integer, or left to be derived (null, or "auto" when HF fills it)."""
        derived = {"type": "string", "pattern": BATCH_DERIVED,
                   "description": f"'auto': filled by HF from {HF_SOURCES[name]}"}
        return {"anyOf": [{"type": "integer", "minimum": 1}, derived, {"type": "null"}]}

    def value_schema(self, owner: type, name: str, tp: Any, field: dataclasses.Field, lax: bool
                     ) -> Tuple[Dict[str, Any], bool]:
        """The schema of the field's value, and whether null is valid too."""
        inner, optional = unwrap_optional(tp)
        if inner is Any:  # validation lets null through wherever the value's model is read from the value
            return self.dynamic(owner, name, field), True
        if dataclasses.is_dataclass(inner):
            return self.ref(inner), optional
        return _value(inner, field.metadata, LAX if lax else PLAIN), optional

    def dynamic(self, owner: type, name: str, field: dataclasses.Field) -> Dict[str, Any]:
        """A field typed ``Any`` whose model depends on a value (``dynamic_model``)."""
        if model_key(field):  # its model is picked by a sibling: see params_by_type
            return {"type": "object"}
        model = dynamic_model(owner, name, {})
        if model is None:
            return {}
        if model in SPARSITY_MODES.values():
            return self.by_mode(model)
        return self.ref(model)

    def by_mode(self, default_model: type) -> Dict[str, Any]:
        """Sparse attention: the keys of the ``mode`` given (``dynamic_model``'s default when none is)."""
        modes = {"type": "string", "enum": list(SPARSITY_MODES), "description": "Sparsity structure"}
        cases = [{"if": {"not": {"required": ["mode"]}}, "then": self.definition(default_model)}]
        cases += [{"if": {"properties": {"mode": {"const": mode}}, "required": ["mode"]},
                   "then": self.definition(model)} for mode, model in SPARSITY_MODES.items()]
        return {"type": "object", "properties": {"mode": modes}, "allOf": cases}

    def params_by_type(self, owner: type, name: str, field: dataclasses.Field) -> List[Dict[str, Any]]:
        """if/then on the sibling key that picks a dynamic field's model (optimizer and scheduler ``params`` by
        ``type``); a name with no model leaves the keys free, "auto" only where HF fills it."""
        key = model_key(field)
        models = field.metadata["models"]
        names = _choices(fields_of(owner)[key][1]) or [*(s.type for s in optimizer.DEEPSPEED_OPTIMIZERS.values()),
                                                       *optimizer.TORCH_OPTIMIZER_PARAMS]
        cases, patterns = [], []
        for type_name in names:
            model = models(type_name)
            if model is None:
                continue
            # matched as the declared mapping matches it: DeepSpeed's optimizers in any case, the others exactly
            pattern = _one_of([type_name], case_insensitive=models(type_name.swapcase()) is model)
            patterns.append(pattern)
            then = {"properties": {name: _either(self.ref(model), [{"type": "null"}])}}
            cases.append({"if": {"properties": {key: {"type": "string", "pattern": pattern}}, "required": [key]},
                          "then": then})
        filled = {k: {"description": f"'auto': filled by HF from {source}"}
                  for k, source in hf_filled_params(owner).items()}
        if owner is optimizer.OptimizerConfig:  # validation.rules: DeepSpeed's engine refuses it
            filled[MAX_GRAD_NORM] = {"not": {}, "description": "DeepSpeed refuses it here: use gradient_clipping"}
        free = {"type": "object", "properties": filled, "additionalProperties": {"not": {"const": AUTO}}}
        known = {"properties": {key: {"type": "string", "pattern": "|".join(patterns)}}, "required": [key]}
        cases.append({"if": known, "else": {"properties": {name: _either(free, [{"type": "null"}])}}})
        return cases


def _takes_text(tp: Any) -> bool:
    """Whether the type takes a string ("auto" would then pass the value's own schema)."""
    inner, _ = unwrap_optional(tp)
    return inner in (str, Any) or (typing.get_origin(inner) is typing.Union and str in typing.get_args(inner))


def _choices(field: dataclasses.Field) -> Optional[List[Any]]:
    choices = field.metadata.get("choices")
    return list(choices) if choices is not None else None


# How DeepSpeed reads a value (``normalize``): coerced as pydantic's lax mode does (the sections it parses with
# pydantic), as written but for integral floats and 0/1 (scalars it reads from the plain dict), or exactly as written.
LAX, PLAIN, EXACT = "lax", "plain", "exact"


def _value(tp: Any, meta: typing.Mapping[str, Any], reading: str) -> Dict[str, Any]:
    """A value of type ``tp`` with the field's choices and range, and what DeepSpeed coerces into it: in a pydantic
    section as ``normalize.coerce`` does, in the plain dict as ``normalize.plain_number`` does."""
    origin = typing.get_origin(tp)
    if origin in (list, List):
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": _value(item, {}, LAX if reading == LAX else EXACT)}
    if origin in (dict, Dict):
        args = typing.get_args(tp)
        values = _value(args[1], {}, EXACT) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": values} if values else {"type": "object"}
    if origin is typing.Union:  # each member with the choices of its own type ("auto" for a str, ...)
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        branches = [_value(a, _member_meta(meta, a), reading) for a in members]
        if str in members:  # pydantic keeps a string a string when the Union takes one: no number written as text
            branches = [b if a is str else _without_text(b) for a, b in zip(members, branches)]
        return _any_of(branches)
    choices = meta.get("choices")
    if tp is bool:
        numbers = {"type": "integer", "enum": [0, 1], "description": "DeepSpeed reads 0/1 as false/true"}
        text = {"$ref": "#/$defs/BooleanText"}
        return _any_of([{"type": "boolean"}] + ([numbers] if reading != EXACT else []) + ([text] if reading == LAX
                                                                                          else []))
    if tp is str:
        if meta.get("nonempty"):
            return {**_value(tp, {k: v for k, v in meta.items() if k != "nonempty"}, reading), "minLength": 1}
        if choices is None:
            return {"type": "string"}
        if meta.get("case_insensitive"):  # DeepSpeed lower-cases the value before comparing
            return {"type": "string", "pattern": _one_of(choices, case_insensitive=True), "examples": list(choices)}
        return {"type": "string", "enum": list(choices)}
    if tp in (int, float):
        number: Dict[str, Any] = {"type": "integer" if tp is int else "number", **_range(meta)}
        if choices is not None:
            number["enum"] = list(choices)
        if reading != LAX:
            return number
        # pydantic's lax mode: true/false are 1/0 (not where DeepSpeed requires a finite number: its validator refuses
        # a boolean first), and numbers may be written as text (their range then goes unchecked)
        flags = [] if meta.get("finite") else [b for b in (False, True) if _allowed(int(b), meta)]
        text: Dict[str, Any] = {"$ref": "#/$defs/IntegerText" if tp is int else
                                "#/$defs/FiniteNumberText" if meta.get("finite") else "#/$defs/NumberText"}
        if choices is not None and tp is int:
            text = {"type": "string", "pattern": "|".join(_int_text(c) for c in choices)}
        flag = [{"type": "boolean", **({"enum": flags} if len(flags) == 1 else {})}] if flags else []
        return _any_of([number, *flag, text])
    if tp is Any:
        return {}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _without_text(schema: Dict[str, Any]) -> Dict[str, Any]:
    """``schema`` without its branches for values written as text (a number or a flag as a string)."""
    def text(branch: Dict[str, Any]) -> bool:
        return branch.get("type") == "string" or str(branch.get("$ref", "")).endswith("Text")

    if "anyOf" not in schema:
        return schema
    return _any_of([b for b in schema["anyOf"] if not text(b)])


def _member_meta(meta: typing.Mapping[str, Any], member: Any) -> typing.Mapping[str, Any]:
    """A Union's metadata as it applies to one member: the choices of the member's type, if any."""
    if meta.get("choices") is None:
        return meta
    own = [c for c in meta["choices"] if type(c) is member or (member is float and type(c) is int)]
    rest = {k: v for k, v in meta.items() if k != "choices"}
    return {**rest, "choices": own} if own else rest


def _range(meta: typing.Mapping[str, Any]) -> Dict[str, Any]:
    words = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum"}
    return {words[k]: meta[k] for k in words if meta.get(k) is not None}


def _allowed(number: float, meta: typing.Mapping[str, Any]) -> bool:
    """Whether a number passes the field's choices and range (``structure._check_constraints``)."""
    if meta.get("choices") is not None and number not in meta["choices"]:
        return False
    return not (("ge" in meta and number < meta["ge"]) or ("gt" in meta and number <= meta["gt"])
                or ("le" in meta and number > meta["le"]))


def _int_text(n: int) -> str:
    """Text that pydantic's lax mode reads as the integer ``n`` ("1", " +01.0 ")."""
    digits = "_?".join(str(abs(n)))
    if n == 0:
        return rf"^\s*[+-]?(?:{_ZEROS}{_FRACTION_ZERO}|\.{_ZEROS})\s*$"
    return rf"^\s*{'-' if n < 0 else '[+]?'}(?:0_?)*{digits}{_FRACTION_ZERO}\s*$"


def _equal_to(value: Any, tp: Any, lax: bool) -> List[Dict[str, Any]]:
    """What validation reads as ``value`` itself (a default) and of the key's type: the value, and the spellings that
    coerce into it."""
    if value is None or value is dataclasses.MISSING or dataclasses.is_dataclass(value) or value == REQUIRED:
        return []
    inner, _ = unwrap_optional(tp)
    out: List[Dict[str, Any]] = [{"const": value}]
    if isinstance(value, bool):
        out.append({"type": "integer", "const": int(value)})  # equal in Python, and what DeepSpeed reads
        if lax:
            out.append({"type": "string", "pattern": _one_of(sorted(_TRUE if value else _FALSE), True)})
    elif lax and isinstance(value, (int, float)) and value in (0, 1):
        out.append({"const": bool(value)})
    if lax and inner is int and isinstance(value, int) and not isinstance(value, bool):
        out.append({"type": "string", "pattern": _int_text(value)})
    return out


def _any_of(branches: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One of ``branches`` (scalar values), as simply as JSON Schema says it."""
    flat: List[Dict[str, Any]] = []
    for branch in branches:
        flat += branch["anyOf"] if set(branch) == {"anyOf"} else [branch]
    if any(b == {} for b in flat):
        return {}
    if len(flat) == 2 and {"type": "null"} in flat:  # "type": [t, "null"] rather than anyOf
        other = flat[1 - flat.index({"type": "null"})]
        if isinstance(other.get("type"), str) and "const" not in other:
            enum = {"enum": [*other["enum"], None]} if "enum" in other else {}
            return {**other, "type": [other["type"], "null"], **enum}
    return flat[0] if len(flat) == 1 else {"anyOf": flat}


def _either(value: Dict[str, Any], others: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``value`` or one of ``others`` (scalars: null, "auto", ...). An object's schema stays outside ``anyOf``, so
    that a mistake inside it is reported at its own path, not as "no alternative matched" at the section's."""
    if not others:
        return value
    if value.get("type") != "object":
        return _any_of([value, *others])
    if all(set(o) == {"type"} for o in others):
        return {**value, "type": ["object", *(o["type"] for o in others)]}
    return {**{k: v for k, v in value.items() if k != "type"}, "if": {"type": "object"}, "else": _any_of(others)}


def _description(meta: typing.Mapping[str, Any], *extra: str) -> str:
    """The field's one-line help, with the notes ``dsconf explain`` lists after it."""
    notes = field_notes(meta) + [e for e in extra if e]
    return f"{meta.get('help', '')} [{'; '.join(notes)}]" if notes else meta.get("help", "")


def _json_default(field: dataclasses.Field) -> Any:
    """The field's default as JSON, or MISSING where it is none a file could hold (a section, a required value,
    dsconf's batch resolver)."""
    default = default_of(field)
    if default is dataclasses.MISSING or dataclasses.is_dataclass(default) or default == REQUIRED:
        return dataclasses.MISSING
    try:
        json.dumps(default)
    except (TypeError, ValueError):
        return dataclasses.MISSING
    return default


def _shown(value: Any) -> str:
    return json.dumps(value)
