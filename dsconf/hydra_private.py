"""Every use dsconf makes of Hydra's (and OmegaConf's) private API, in one place.

Hydra 1.3 has no public hook before composition (to report a composition mistake as dsconf's one-line problem),
none for the text of ``--help``'s group list, none for shell completion of keys that are still null, and none to
check a sweep's jobs before the first one starts and hand their composed configs to the launcher. dsconf wraps
these methods only while the running app is dsconf's (``dsconf.launch.command_line.on_search_path`` decides,
for every Hydra app, before it composes): every other app in the environment runs Hydra's own methods.
``tests/test_hydra_private.py`` checks each thing relied on here, so that a Hydra release that changes one of
them fails there, by name.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Mapping, Optional


@dataclass(frozen=True)
class Patch:
    """A method of a Hydra class that dsconf wraps in dsconf apps."""

    module: str
    owner: str
    name: str
    static: bool = False  # a staticmethod: wrapped as one

    def owner_class(self) -> Any:
        return getattr(importlib.import_module(self.module), self.owner)


HYDRA_RUN = Patch("hydra._internal.hydra", "Hydra", "run")
HYDRA_MULTIRUN = Patch("hydra._internal.hydra", "Hydra", "multirun")
HYDRA_FORMAT_CONFIG_GROUPS = Patch("hydra._internal.hydra", "Hydra", "format_config_groups")
# not BasicSweeper itself: Hydra's plugin scan re-executes its module, replacing the class
PLUGINS_INSTANTIATE_SWEEPER = Patch("hydra.core.plugins", "Plugins", "instantiate_sweeper")
SWEEPER_VALIDATE_BATCH = Patch("hydra.plugins.sweeper", "Sweeper", "validate_batch_is_legal")
COMPLETION_GET_MATCHES = Patch("hydra.plugins.completion_plugin", "CompletionPlugin", "_get_matches", static=True)
PATCHES = (HYDRA_RUN, HYDRA_MULTIRUN, HYDRA_FORMAT_CONFIG_GROUPS, PLUGINS_INSTANTIATE_SWEEPER,
           SWEEPER_VALIDATE_BATCH, COMPLETION_GET_MATCHES)

# Modules whose frames mean "Hydra was composing a config" (a frame of the task means the task raised).
COMPOSING_MODULES = ("hydra._internal.config_loader_impl", "hydra._internal.config_repository",
                     "hydra._internal.defaults_list", "hydra.core.override_parser")
TASK_FRAME = "run_job"  # hydra.core.utils.run_job: the frame every task runs under
HYDRA_MAIN_FRAME = ("hydra._internal.utils", "_run_hydra")  # hydra.main's command-line entry point

_originals: dict = {}  # Patch -> the class attribute it replaced, while patched


def apply(wrappers: Mapping[Patch, Callable[[Callable[..., Any]], Callable[..., Any]]]) -> None:
    """Wrap each method with ``wrappers[patch](original)``; a method already wrapped stays as it is."""
    for patch, make in wrappers.items():
        if patch in _originals:
            continue
        owner = patch.owner_class()
        raw = owner.__dict__[patch.name]
        original = raw.__func__ if isinstance(raw, staticmethod) else raw
        wrapped = make(original)
        _originals[patch] = raw
        setattr(owner, patch.name, staticmethod(wrapped) if patch.static else wrapped)


def restore() -> None:
    """Put back every method ``apply`` wrapped: Hydra as it ships."""
    for patch, raw in list(_originals.items()):
        setattr(patch.owner_class(), patch.name, raw)
        del _originals[patch]


def applied() -> List[Patch]:
    return list(_originals)


def frames(chain: List[BaseException]) -> Iterator[tuple[str, str]]:
    """(module, function) of every frame the exceptions of ``chain`` went through."""
    for cause in chain:
        tb = cause.__traceback__
        while tb is not None:
            yield str(tb.tb_frame.f_globals.get("__name__", "")), tb.tb_frame.f_code.co_name
            tb = tb.tb_next


def raised_by_task(chain: List[BaseException]) -> bool:
    return any(name == TASK_FRAME for _, name in frames(chain))


def raised_while_composing(chain: List[BaseException]) -> bool:
    """Raised while Hydra composed a config (not by the task): a frame of Hydra's config loading, no task frame."""
    seen = list(frames(chain))
    if any(name == TASK_FRAME for _, name in seen):
        return False
    return any(module.startswith(COMPOSING_MODULES) for module, _ in seen)


def called_from_hydra_main(depth: int = 2) -> bool:
    """The caller runs under ``hydra.main``'s command-line entry point (not Hydra's API called from Python)."""
    frame: Any = sys._getframe(depth)
    module, function = HYDRA_MAIN_FRAME
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False


_NOT_UNDER_HYDRA_MAIN: Any = object()


def hydra_main_config_name() -> Any:
    """The primary config name ``hydra.main`` is running with (its ``--config-name`` applied), or
    ``NOT_UNDER_HYDRA_MAIN`` when the caller is not under ``hydra.main`` (Hydra's compose API, say)."""
    frame: Any = sys._getframe(1)
    module, function = HYDRA_MAIN_FRAME
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return frame.f_locals.get("config_name")
        frame = frame.f_back
    return _NOT_UNDER_HYDRA_MAIN


NOT_UNDER_HYDRA_MAIN = _NOT_UNDER_HYDRA_MAIN


def is_basic_sweeper(sweeper: Any) -> bool:
    return type(sweeper).__name__ == "BasicSweeper"


def basic_sweeper_params(sweeper: Any) -> List[str]:
    """The ``hydra.sweeper.params`` of a basic sweeper, as overrides."""
    return list(sweeper._parse_config())


def sweeper_launcher(sweeper: Any) -> Optional[Any]:
    """The launcher a set-up sweeper hands its jobs to (``BasicSweeper.setup`` sets it), or None."""
    return getattr(sweeper, "launcher", None)


def split_sweep(parsed_overrides: List[Any]) -> List[List[str]]:
    """Every job of a basic-sweeper sweep, as its list of overrides, in Hydra's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [job for batch in BasicSweeper.split_arguments(parsed_overrides, None) for job in batch]


def restore_singletons(state: Any) -> None:
    """Install a parent's Hydra singletons (HydraConfig, ConfigStores, JobRuntime) and OmegaConf resolvers.

    Unlike ``Singleton.set_state`` this does not re-discover plugins: a rank does not need them, and discovery
    imports every ``hydra_plugins`` module. Hydra finds them lazily if the task asks.
    """
    if state is None:
        return
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    Singleton._instances.update(state["instances"])
    BaseContainer._resolvers = state["omegaconf_resolvers"]
