"""A dsconf app's own command line speaks dsconf; every other Hydra app's is Hydra's, untouched.

For an app whose config is dsconf's (``@dsconf.main``, or a plain ``@hydra.main`` one of whose primary configs
lists ``dsconf``), a composition mistake (``python train.py deepspeed.zero_optimization.overlap_com=true``) is
reported as ``dsconf check`` reports it, exit 2, instead of Hydra's text (whose advice to append with ``+`` fails
for a typed config)::

    dsconf: deepspeed.zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)

A ``-m`` sweep through Hydra's basic sweeper is composed and validated job by job before any job starts
(``dsconf.launch.sweep_check``): every job's problems are reported at once, and nothing runs; Hydra's own check
that each batch composes is skipped for the jobs composed there, and dsconf's launcher takes their configs, so each
job is composed once. ``--help`` lists each of dsconf's options with a line on what it sets; shell completion also
offers the keys of ``deepspeed`` sections that are still null.

Hydra has no public hook for any of these; the methods wrapped are listed in ``dsconf.hydra_private``, and wrapped
only while the app Hydra is creating is dsconf's (``on_search_path``, which Hydra's search-path plugin calls for
every app before it composes). Errors raised by the task itself, Hydra's API called from Python (tests,
notebooks), and ``HYDRA_FULL_ERROR=1`` keep Hydra's behaviour.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, List, Optional

from dsconf import hydra_private
from dsconf.config_source import command_line_config_dirs, in_dsconf_app, search_path_elements, search_path_lists_dsconf
from dsconf.errors import EXIT_CONFIG_ERROR, ConfigError, exit_with
from dsconf.names import BASE_CONFIG_NAME, LAZY, PROVIDER, SEARCH_PATH

_CHECKED_JOBS = "_dsconf_checked_jobs"  # on a sweeper whose sweep dsconf checked: its ComposedJobs


def on_search_path(search_path: Any) -> None:
    """For every Hydra app, before it composes: if, and only if, the app is dsconf's, dsconf's config source on its
    search path and dsconf's command-line behaviour (``dsconf.config_source`` says which apps are)."""
    elements = search_path_elements(search_path)
    config_name = hydra_private.hydra_main_config_name()
    under_hydra_main = config_name is not hydra_private.NOT_UNDER_HYDRA_MAIN
    if (in_dsconf_app() or config_name == BASE_CONFIG_NAME
            or search_path_lists_dsconf(elements + command_line_config_dirs(sys.argv[1:] if under_hydra_main else []))):
        search_path.append(provider=PROVIDER, path=SEARCH_PATH)
        hydra_private.apply(WRAPPERS)
        return
    hydra_private.restore()
    if not under_hydra_main and not any(provider == "main" for provider, _ in elements):
        # Hydra's compose API without a config dir: the primary config is named later, and may be dsconf
        search_path.append(provider=PROVIDER, path=f"{SEARCH_PATH}{LAZY}")


def _reporting(method: Callable[..., Any]) -> Callable[..., Any]:
    """``Hydra.run``/``multirun``: a config mistake found while composing ends as one line, exit 2."""
    def wrapper(self: Any, config_name: Optional[str], task_function: Any, overrides: List[str],
                *args: Any, **kwargs: Any) -> Any:
        if _full_error_wanted() or not hydra_private.called_from_hydra_main():
            return method(self, config_name, task_function, overrides, *args, **kwargs)
        try:
            return method(self, config_name, task_function, overrides, *args, **kwargs)
        except Exception as err:
            from dsconf.composition import exception_chain, hydra_error_with_overrides

            chain = exception_chain(err)
            if isinstance(err, ConfigError) and not hydra_private.raised_by_task(chain):
                exit_with(str(err), EXIT_CONFIG_ERROR)
            if not hydra_private.raised_while_composing(chain):
                raise
            exit_with(str(hydra_error_with_overrides(err, list(overrides), _base_config(self, config_name))),
                      EXIT_CONFIG_ERROR)

    wrapper.__doc__ = method.__doc__
    return wrapper


def _checking_first(instantiate_sweeper: Callable[..., Any]) -> Callable[..., Any]:
    """A basic sweeper of a command-line multirun checks every job before its first job starts."""
    def wrapper(self: Any, **kwargs: Any) -> Any:
        sweeper = instantiate_sweeper(self, **kwargs)
        if not hydra_private.is_basic_sweeper(sweeper) or _full_error_wanted() \
                or not hydra_private.called_from_hydra_main():
            return sweeper
        sweep = sweeper.sweep

        def checked_sweep(arguments: List[str]) -> Any:
            from dsconf.launch.sweep_check import check_sweep

            loader = sweeper.hydra_context.config_loader
            composed = check_sweep(sweeper.config, loader, hydra_private.basic_sweeper_params(sweeper)
                                   + list(arguments))
            setattr(sweeper, _CHECKED_JOBS, composed)
            launcher = hydra_private.sweeper_launcher(sweeper)
            if hasattr(launcher, "use_composed_jobs"):  # dsconf's launcher; Hydra's compose each job themselves
                launcher.use_composed_jobs(composed)
            return sweep(arguments)

        sweeper.sweep = checked_sweep
        return sweeper

    return wrapper


def _unless_checked(validate: Callable[..., None]) -> Callable[..., None]:
    """Hydra's check that each job of a batch composes, for the jobs ``check_sweep`` has not composed already."""
    def wrapper(self: Any, batch: Any) -> None:
        checked = getattr(self, _CHECKED_JOBS, ())
        validate(self, [job for job in batch if job not in checked])

    return wrapper


def _with_option_help(method: Callable[..., str]) -> Callable[..., str]:
    """``--help`` lists each of dsconf's groups with a line per option (``dsconf.groups.option_help``)."""
    def wrapper(self: Any, predicate: Callable[[str], bool], compact: bool = True) -> str:
        from dsconf.groups import GROUP_HELP, group_options, option_help

        text = method(self, predicate, compact)
        ours = group_options()
        chosen = _choices()
        lines = []
        for line in text.splitlines():
            group = line.split(":", 1)[0]
            if group not in ours or not compact:
                lines.append(line)
                continue
            width = max(len(o) for o in ours[group]) + len(" (chosen)")
            lines.append(f"{group}: {GROUP_HELP[group]}")
            for option in ours[group]:
                name = option + (" (chosen)" if chosen.get(group) == option else "")
                lines.append(f"  {name:<{width}}  {option_help(group, option)}")
        return "\n".join(lines) + "\n"

    return wrapper


def _choices() -> dict:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return dict(HydraConfig.get().runtime.choices)


def _with_schema_keys(get_matches: Callable[[Any, str], List[str]]) -> Callable[[Any, str], List[str]]:
    """Shell completion also offers the keys of ``deepspeed`` sections that are still null (from the schema)."""
    def wrapper(config: Any, word: str) -> List[str]:
        matches = get_matches(config, word)
        from dsconf.schema.root import DEEPSPEED_NODE

        if matches or not word.startswith(f"{DEEPSPEED_NODE}.") or word.endswith("="):
            return matches
        from dsconf.schema.introspect import fields_of, model_at, unwrap_optional

        base, _, partial = word.rpartition(".")
        model = model_at(base)
        if model is None:
            return matches
        out = []
        for name, (tp, _) in fields_of(model).items():
            if name.startswith(partial):
                nested = isinstance(unwrap_optional(tp)[0], type) and dataclasses.is_dataclass(unwrap_optional(tp)[0])
                out.append(f"{base}.{name}{'.' if nested else '='}")
        return sorted(out)

    return wrapper


WRAPPERS = {
    hydra_private.HYDRA_RUN: _reporting,
    hydra_private.HYDRA_MULTIRUN: _reporting,
    hydra_private.HYDRA_FORMAT_CONFIG_GROUPS: _with_option_help,
    hydra_private.PLUGINS_INSTANTIATE_SWEEPER: _checking_first,
    hydra_private.SWEEPER_VALIDATE_BATCH: _unless_checked,
    hydra_private.COMPLETION_GET_MATCHES: _with_schema_keys,
}


def _base_config(hydra: Any, config_name: Optional[str]) -> Any:
    """The app's primary config composed without the command line's overrides; None if that fails too."""
    from hydra.types import RunMode

    try:
        return hydra.compose_config(config_name=config_name, overrides=[], run_mode=RunMode.RUN)
    except Exception:
        return None


def _full_error_wanted() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"
