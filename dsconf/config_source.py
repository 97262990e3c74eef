"""Where Hydra finds dsconf's configs (``dsconf://``), and which Hydra apps are dsconf's.

Hydra discovers plugins for every app in the environment, so nothing dsconf registers at discovery may change an
app that does not use dsconf. dsconf's base config and group options therefore live in a store of their own
(``GroupStore``), not in Hydra's global ConfigStore (whose entries Hydra merges into any app's YAML of the same
path, "automatic schema matching", and whose groups every app would list). Hydra reads them through
``DsconfConfigSource``, which is on an app's search path only if the app is dsconf's:

- a ``@dsconf.main`` app, or dsconf's own API (``dsconf_app()``);
- an app one of whose primary configs lists ``dsconf`` in its defaults list (``search_path_lists_dsconf``: the
  YAML files at the top of its config dirs, ``--config-dir`` included, and root configs in Hydra's ConfigStore);
- an app whose primary config *is* ``dsconf`` (``@hydra.main(config_path=None, config_name="dsconf")``).

An app created through Hydra's compose API without a config dir (``initialize(config_path=None)``) names its
primary config only later: it gets ``dsconf://`` in a mode that serves the base config alone until the app
composes it (``LAZY``), so that ``compose("dsconf", ["zero=stage2"])`` works and nothing else changes.

A dsconf app whose own config group would shadow one of dsconf's options (its ``conf/optimizer/adam.yaml``) gets a
one-line ``ConfigError`` naming both, instead of Hydra silently picking one.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource

from dsconf.errors import ConfigError, Problem
from dsconf.names import BASE_CONFIG_NAME, LAZY, SCHEME

_BASE_FILE = f"{BASE_CONFIG_NAME}.yaml"
_LISTS_DSCONF = re.compile(rf"^\s*-\s*{BASE_CONFIG_NAME}\s*$", re.MULTILINE)  # for YAML too broken to parse

_in_dsconf_app = False  # set while a @dsconf.main app or dsconf's own API runs (dsconf_app())


def group_store() -> ConfigStore:
    """dsconf's own store of its configs, filled on first use (``dsconf.groups``)."""
    from dsconf.groups import group_store as filled

    return filled()


@contextlib.contextmanager
def dsconf_app() -> Iterator[None]:
    """While a ``@dsconf.main`` app or dsconf's own API runs: every Hydra app created meanwhile is dsconf's."""
    global _in_dsconf_app
    previous, _in_dsconf_app = _in_dsconf_app, True
    try:
        yield
    finally:
        _in_dsconf_app = previous


def in_dsconf_app() -> bool:
    return _in_dsconf_app


def lists_dsconf(text: str) -> bool:
    """A primary config's YAML text whose defaults list names dsconf's base config."""
    if BASE_CONFIG_NAME not in text:
        return False
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:  # too broken for Hydra to compose: still an app meant to be dsconf's
        return bool(_LISTS_DSCONF.search(text))
    defaults = data.get("defaults") if isinstance(data, dict) else None
    return isinstance(defaults, list) and BASE_CONFIG_NAME in defaults


def search_path_lists_dsconf(elements: Iterable[Tuple[str, str]]) -> bool:
    """Some primary config on the search path (``(provider, "scheme://path")`` pairs) lists ``dsconf``: a YAML file
    at the top of a ``file://`` or ``pkg://`` entry, or a root config in Hydra's ConfigStore."""
    for provider, path in elements:
        scheme, sep, where = path.partition("://")
        if not sep:  # Hydra reads a path without a scheme as a directory
            scheme, where = "file", path
        if provider == "hydra" or scheme == SCHEME:
            continue
        texts = _root_yaml_texts(scheme, where)
        if any(lists_dsconf(text) for text in texts):
            return True
    return _config_store_lists_dsconf()


def command_line_config_dirs(argv: List[str]) -> List[Tuple[str, str]]:
    """``--config-dir``/``-cd`` of a ``hydra.main`` command line, as search-path entries (Hydra adds them only after
    the search-path plugins have run)."""
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--config-dir", "-cd"):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value:
                out.append(("command-line", f"file://{os.path.abspath(value)}"))
    return out


def _root_yaml_texts(scheme: str, where: str) -> Iterator[str]:
    if scheme == "file":
        with contextlib.suppress(OSError):
            for entry in os.scandir(where or "."):
                if entry.name.endswith(".yaml") and entry.is_file():
                    with contextlib.suppress(OSError, UnicodeDecodeError):
                        with open(entry.path, encoding="utf-8") as fh:
                            yield fh.read()
    elif scheme == "pkg":
        import importlib.resources

        try:
            files = list(importlib.resources.files(where.replace("/", ".")).iterdir())
        except (ImportError, TypeError, ValueError, OSError, AttributeError):
            return
        for item in files:
            if item.name.endswith(".yaml") and item.is_file():
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    yield item.read_text(encoding="utf-8")


def _config_store_lists_dsconf() -> bool:
    for name, node in ConfigStore.instance().repo.items():
        if name.endswith(".yaml") and hasattr(node, "node"):
            defaults = node.node.get("defaults") if hasattr(node.node, "get") else None
            if defaults is not None and BASE_CONFIG_NAME in list(defaults):
                return True
    return False


class DsconfConfigSource(ConfigSource):
    """``dsconf://``: dsconf's base config and group options, read from ``GroupStore``."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        self._serves_groups = self.path != LAZY
        self._checked = False  # the app's own groups checked against dsconf's options

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def available(self) -> bool:
        return True

    def load_config(self, config_path: str) -> ConfigResult:
        name = self._normalize_file_name(config_path)
        if name == _BASE_FILE:
            self._serves_groups = True  # the app composes dsconf's base config: it is a dsconf app
        self._check_once()
        ret = group_store().load(config_path=name)
        return ConfigResult(config=ret.node, path=self.full_path(), provider=ret.provider or self.provider,
                            header={"package": ret.package})

    def is_group(self, config_path: str) -> bool:
        if not self._serves_groups:
            return False
        self._check_once()
        return group_store().get_type(config_path.rstrip("/")) == ObjectType.GROUP

    def is_config(self, config_path: str) -> bool:
        name = self._normalize_file_name(config_path.rstrip("/"))
        if not self._serves_groups:
            return name == _BASE_FILE
        self._check_once()
        return group_store().get_type(name) == ObjectType.CONFIG

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if not self._serves_groups:
            return []
        out: List[str] = []
        for name in group_store().list(config_path):
            self._list_add_result(files=out, file_path=f"{config_path}/{name}", file_name=name,
                                  results_filter=results_filter)
        return sorted(set(out))

    def _check_once(self) -> None:
        if not self._checked:
            self._checked = True
            check_no_shadowed_options(self._siblings())

    def _siblings(self) -> List[ConfigSource]:
        """The other sources of the app this source belongs to (none if that app is not Hydra's global one; Hydra
        composes through a copy of its sources, so this source is known by its scheme)."""
        from hydra.core.global_hydra import GlobalHydra

        global_hydra = GlobalHydra.instance()
        if not global_hydra.is_initialized():
            return []
        sources = list(global_hydra.config_loader().get_sources())
        if not any(s.scheme() == SCHEME for s in sources):
            return []
        return [s for s in sources if s.scheme() != SCHEME and s.provider != "hydra"]


def check_no_shadowed_options(sources: Iterable[ConfigSource]) -> None:
    """No option of the app's own in one of dsconf's groups has the name of one of dsconf's options."""
    from dsconf.groups import group_options

    for source in sources:
        for group, options in group_options().items():
            if not source.is_group(group):
                continue
            shadowed = sorted(set(options) & set(source.list(group, ObjectType.CONFIG)))
            if shadowed:
                option = shadowed[0]
                raise ConfigError(Problem(
                    f"{group}={option}",
                    f"your config {group}/{option} ({source.full_path()}) has the name of dsconf's option "
                    f"{group}={option}, so Hydra would pick one of the two",
                    f"rename yours (e.g. {group}=my_{option}), or your group (e.g. my_{group})"))


def search_path_elements(search_path: Any) -> List[Tuple[str, str]]:
    """``(provider, path)`` of each entry of a Hydra ``ConfigSearchPath``."""
    return [(element.provider, element.path) for element in search_path.get_path()]

