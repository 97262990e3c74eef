"""Reading DeepSpeed config files as DeepSpeed reads them: JSON, JSON with comments (hjson), or YAML.

DeepSpeed loads a config path with hjson and refuses duplicate keys; so does dsconf. A file that cannot be
read is an ``UnreadableConfig`` naming the file and, where the parser knows it, the line and column: a missing or
empty file, a directory, text that is not UTF-8 (DeepSpeed opens files with the locale's encoding, UTF-8 on every
system it supports; UTF-16 is named as such), nesting deeper than a parser can follow. A JSON file that only hjson
reads (comments, trailing or missing commas, a byte-order mark) is read, with a warning: HF Trainer and Accelerate
read DeepSpeed config files with ``json.load``, which stops there.
"""

from __future__ import annotations

import codecs
import json
from typing import Any, Dict, List, Optional, Tuple

YAML_SUFFIXES = (".yaml", ".yml")
_UTF16_32_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
                  (codecs.BOM_UTF16_BE, "UTF-16"))


class UnreadableConfig(Exception):
    """A config file that is missing or malformed (not a config mistake inside a readable file)."""


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (DeepSpeed refuses duplicate keys)")
        out[key] = value
    return out


def read_config_file(path: str, warnings: Optional[List[str]] = None) -> Dict[str, Any]:
    """The config in ``path`` as a plain dict; what reads differently elsewhere is appended to ``warnings``."""
    text = read_text(path)
    try:
        data = (_parse_yaml(path, text) if path.lower().endswith(YAML_SUFFIXES)
                else _parse_json(path, text, warnings if warnings is not None else []))
    except RecursionError:
        raise UnreadableConfig(f"{path}: nested too deeply to read (no DeepSpeed config is)") from None
    if not isinstance(data, dict):
        raise UnreadableConfig(f"{path}: expected a JSON object (a DeepSpeed config), got {type(data).__name__}")
    return data


def read_text(path: str) -> str:
    """The file's text, decoded as UTF-8 (a UTF-8 byte-order mark is kept for the parsers to judge)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise UnreadableConfig(f"{path}: cannot read: {err.strerror or err}") from None
    for bom, encoding in _UTF16_32_BOMS:
        if raw.startswith(bom):
            raise UnreadableConfig(f"{path}: {encoding} text: DeepSpeed reads config files as UTF-8 (save it as "
                                   "UTF-8)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise UnreadableConfig(f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line}): DeepSpeed "
                               "reads config files as UTF-8 (save it as UTF-8)") from None
    if not text.lstrip("\ufeff").strip():
        raise UnreadableConfig(f"{path}: the file is empty (a DeepSpeed config is a JSON object, e.g. "
                               '{"train_micro_batch_size_per_gpu": 8})')
    return text


def _parse_json(path: str, text: str, warnings: List[str]) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        json_error = err
    except ValueError as err:  # a duplicate key
        raise UnreadableConfig(f"{path}: {err}") from None
    try:  # JSON with comments or trailing commas: DeepSpeed reads files with hjson
        import hjson
    except ImportError:
        hjson = None
    if hjson is not None:
        try:
            data = hjson.loads(text, object_pairs_hook=_no_duplicates)  # the hook builds plain dicts
        except hjson.HjsonDecodeError:
            pass  # report JSON's position: it is the more precise one for a JSON file
        except ValueError as err:
            raise UnreadableConfig(f"{path}: {err}") from None
        else:
            warnings.append(f"not strict JSON at line {json_error.lineno}, column {json_error.colno} "
                            f"({json_error.msg}): DeepSpeed reads it (as hjson), but HF Trainer and Accelerate "
                            "read config files with json.load, which stops there")
            return data
    raise UnreadableConfig(f"{path}: malformed JSON at line {json_error.lineno}, column {json_error.colno}: "
                           f"{json_error.msg}") from None


def _parse_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise UnreadableConfig(f"{path}: malformed YAML{where}: {getattr(err, 'problem', None) or err}") from None

