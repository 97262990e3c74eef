"""Reading DeepSpeed config files as DeepSpeed reads them: JSON, JSON with comments (hjson), or YAML.

DeepSpeed loads a config path with hjson and refuses duplicate keys; so does dsconf. A file that cannot be
read is an ``UnreadableConfig`` naming the file and, where the parser knows it, the line and column.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

YAML_SUFFIXES = (".yaml", ".yml")


class UnreadableConfig(Exception):
    """A config file that is missing or malformed (not a config mistake inside a readable file)."""


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} (DeepSpeed refuses duplicate keys)")
        out[key] = value
    return out


def read_config_file(path: str) -> Dict[str, Any]:
    """The config in ``path`` as a plain dict."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise UnreadableConfig(f"{path}: cannot read: {err.strerror or err}") from None
    data = _parse_yaml(path, text) if path.lower().endswith(YAML_SUFFIXES) else _parse_json(path, text)
    if not isinstance(data, dict):
        raise UnreadableConfig(f"{path}: expected a JSON object (a DeepSpeed config), got {type(data).__name__}")
    return data


def _parse_json(path: str, text: str) -> Any:
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
            return hjson.loads(text, object_pairs_hook=_no_duplicates)  # the hook builds plain dicts
        except hjson.HjsonDecodeError:
            pass  # report JSON's position: it is the more precise one for a JSON file
        except ValueError as err:
            raise UnreadableConfig(f"{path}: {err}") from None
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

