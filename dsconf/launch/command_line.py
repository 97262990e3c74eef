"""The training script's own command line speaks dsconf: composition mistakes are one-line problems, exit 2.

Hydra reports a composition mistake (``python train.py deepspeed.zero_optimization.overlap_com=true``) with its
own text, exit 1, and for a key that a struct config does not have it advises appending with ``+``, which fails
too. For an app whose config is dsconf's (``@dsconf.main``, or a plain ``@hydra.main`` whose primary config
lists ``dsconf``), the same mistake is reported as ``dsconf check`` reports it::

    dsconf: deepspeed.zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)

``install()`` wraps ``Hydra.run`` and ``Hydra.multirun`` (Hydra offers no hook before composition). It runs when
Hydra discovers dsconf's launcher plugin, which Hydra does for every app before composing, so plain
``@hydra.main`` apps get it too. Apps whose config is not dsconf's, errors raised by the task itself, and
``HYDRA_FULL_ERROR=1`` keep Hydra's behaviour. A ``-m`` sweep through Hydra's basic sweeper is composed and
validated job by job before any job starts (the basic sweeper's ``sweep`` checks first): every job's problems are
reported at once, and nothing runs. Hydra's own check that each batch composes is skipped for the jobs composed
here, and dsconf's launcher takes their configs back, so each job is composed once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from typing import Any, Callable, Iterator, List, Optional

from dsconf.errors import ConfigError, Problem

EXIT_CONFIG_ERROR = 2
_COMPOSING_MODULES = ("hydra._internal.config_loader_impl", "hydra._internal.config_repository",
                      "hydra._internal.defaults_list", "hydra.core.override_parser")
_WRAPPED = "__dsconf_wrapped__"
_LISTS_DSCONF = re.compile(r"^\s*-\s*dsconf\s*$", re.MULTILINE)
_composed_jobs: dict = {}  # job overrides -> its config, composed by check_sweep, taken by the dsconf launcher
_checked_jobs: set = set()  # job overrides check_sweep composed: Hydra need not compose them again
_dsconf_main = False  # this process runs a @dsconf.main app: its config is dsconf's whatever fails to compose
_checking_sweeps = False  # a command-line multirun is running: the basic sweeper checks its jobs first


@contextlib.contextmanager
def dsconf_app() -> Iterator[None]:
    """While a ``@dsconf.main`` app runs: its config is dsconf's, whatever fails to compose."""
    global _dsconf_main
    previous, _dsconf_main = _dsconf_main, True
    try:
        yield
    finally:
        _dsconf_main = previous


def install() -> None:
    """Wrap Hydra's run and multirun once; a second call is a no-op."""
    from hydra._internal.hydra import Hydra

    if getattr(Hydra.run, _WRAPPED, False):
        return
    Hydra.run = _reporting(Hydra.run, sweep=False)  # type: ignore[method-assign]
    Hydra.multirun = _reporting(Hydra.multirun, sweep=True)  # type: ignore[method-assign]
    Hydra.format_config_groups = _with_option_help(Hydra.format_config_groups)  # type: ignore[method-assign]
    # not BasicSweeper's class itself: Hydra's plugin scan re-executes its module, replacing the class
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    Plugins.instantiate_sweeper = _checking_first(Plugins.instantiate_sweeper)  # type: ignore[method-assign]
    Sweeper.validate_batch_is_legal = _unless_checked(Sweeper.validate_batch_is_legal)  # type: ignore[method-assign]
    from hydra.plugins.completion_plugin import CompletionPlugin

    CompletionPlugin._get_matches = staticmethod(_with_schema_keys(CompletionPlugin._get_matches))  # type: ignore


def _reporting(method: Callable[..., Any], *, sweep: bool) -> Callable[..., Any]:
    def wrapper(self: Any, config_name: Optional[str], task_function: Any, overrides: List[str],
                *args: Any, **kwargs: Any) -> Any:
        if _full_error_wanted() or not _from_command_line():
            # Hydra's API called from Python (tests, notebooks) gets Hydra's exceptions, unchanged
            return method(self, config_name, task_function, overrides, *args, **kwargs)
        try:
            with _sweeps_checked(sweep):
                return method(self, config_name, task_function, overrides, *args, **kwargs)
        except Exception as err:
            if isinstance(err, ConfigError) and not _raised_by_task(err):
                _exit(err)
            if not is_composition_error(err):
                raise
            base = _base_config(self, config_name)
            if not (_dsconf_main or is_dsconf_config(base) or _broken_yaml_lists_dsconf(err)):
                raise
            from dsconf.composition import hydra_error_with_overrides

            _exit(hydra_error_with_overrides(err, list(overrides), base))

    wrapper.__doc__ = method.__doc__
    setattr(wrapper, _WRAPPED, True)
    return wrapper


@contextlib.contextmanager
def _sweeps_checked(on: bool) -> Iterator[None]:
    global _checking_sweeps
    previous, _checking_sweeps = _checking_sweeps, on
    try:
        yield
    finally:
        _checking_sweeps = previous
        _composed_jobs.clear()
        _checked_jobs.clear()


def _checking_first(instantiate_sweeper: Callable[..., Any]) -> Callable[..., Any]:
    """A basic sweeper of a command-line multirun checks every job before its first job starts."""
    def wrapper(self: Any, **kwargs: Any) -> Any:
        sweeper = instantiate_sweeper(self, **kwargs)
        if _checking_sweeps and type(sweeper).__name__ == "BasicSweeper":
            sweep = sweeper.sweep

            def checked_sweep(arguments: List[str]) -> Any:
                loader = sweeper.hydra_context.config_loader
                check_sweep(sweeper.config, loader, sweeper._parse_config() + list(arguments))
                return sweep(arguments)

            sweeper.sweep = checked_sweep
        return sweeper

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _unless_checked(validate: Callable[..., None]) -> Callable[..., None]:
    """Hydra's check that each job of a batch composes, for the jobs ``check_sweep`` has not composed already."""
    def wrapper(self: Any, batch: Any) -> None:
        validate(self, [job for job in batch if tuple(job) not in _checked_jobs])

    setattr(wrapper, _WRAPPED, True)
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

    setattr(wrapper, _WRAPPED, True)
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
        if matches or not word.startswith("deepspeed.") or word.endswith("="):
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


def is_composition_error(err: BaseException) -> bool:
    """Raised while Hydra composed a config (not by the task): a frame of Hydra's config loading, no task frame."""
    frames = list(_frames(err))
    if any(name == "run_job" for _, name in frames):
        return False
    return any(module.startswith(_COMPOSING_MODULES) for module, _ in frames)


def _base_config(hydra: Any, config_name: Optional[str]) -> Any:
    """The app's primary config composed without the command line's overrides; None if that fails too."""
    from hydra.types import RunMode

    try:
        return hydra.compose_config(config_name=config_name, overrides=[], run_mode=RunMode.RUN)
    except Exception:
        return None


def is_dsconf_config(cfg: Any) -> bool:
    from omegaconf import OmegaConf

    from dsconf.schema.deepspeed import DeepSpeedConfig

    node = cfg.get("deepspeed") if hasattr(cfg, "get") else None
    return node is not None and OmegaConf.get_type(node) is DeepSpeedConfig


def check_sweep(cfg: Any, config_loader: Any, arguments: List[str]) -> None:
    """Compose and validate every job of a basic-sweeper sweep (``arguments``: its params, then the command line's
    overrides); one ``ConfigError`` naming each bad job."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    if not is_dsconf_config(cfg):
        return
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(arguments))
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    # only the dsconf launcher takes these back; Hydra's own launchers compose each job themselves
    keep = str(OmegaConf.select(cfg, "hydra.launcher._target_") or "").endswith("DsconfLauncher")
    _composed_jobs.clear()
    _checked_jobs.clear()
    problems: List[Problem] = []
    for num, job in enumerate(jobs):
        where = f"job #{num} ({' '.join(job)})"
        try:
            job_cfg = config_loader.load_sweep_config(cfg, list(job))
            if keep:
                _composed_jobs[tuple(job)] = job_cfg
            _checked_jobs.add(tuple(job))
            validate_job(job_cfg)
        except ConfigError as err:
            problems += [Problem(p.path, f"{where}: {p.message}", p.hint) for p in err.problems]
        except Exception as err:
            if not is_composition_error(err):
                raise
            from dsconf.composition import hydra_error_with_overrides

            problem = hydra_error_with_overrides(err, list(job), cfg).problems[0]
            problems.append(Problem(problem.path, f"{where}: {problem.message}", problem.hint))
    if problems:
        raise ConfigError(problems)


def take_composed_job(overrides: List[str]) -> Any:
    """The job's config as ``check_sweep`` composed it (composing is most of a short job's start-up), or None."""
    return _composed_jobs.pop(tuple(overrides), None)


def validate_job(job_cfg: Any) -> None:
    """What the launcher checks before starting a job's ranks: ``dist``, then the DeepSpeed dict per world size."""
    from omegaconf import OmegaConf

    from dsconf.launch.core import dist_settings, export_for_world_sizes, plan_job
    from dsconf.launch.sweep import task_cfg

    launcher_dist = OmegaConf.select(job_cfg, "hydra.launcher.dist")  # hydra/launcher=dsconf's defaults
    task = task_cfg(job_cfg)
    plan = plan_job(dist_settings(task, launcher_dist))
    export_for_world_sizes(task, plan.world_sizes, plan)


def _broken_yaml_lists_dsconf(err: BaseException) -> bool:
    """A YAML file too malformed to compose, whose text lists dsconf in a defaults list."""
    from dsconf.composition import exception_chain

    for cause in exception_chain(err):
        mark = getattr(cause, "problem_mark", None)
        if mark is not None and os.path.isfile(str(mark.name)):
            with open(str(mark.name), encoding="utf-8", errors="replace") as fh:
                return bool(_LISTS_DSCONF.search(fh.read()))
    return False


def _frames(err: BaseException) -> Iterator[tuple[str, str]]:
    """(module, function) of every frame the error and its causes went through."""
    from dsconf.composition import exception_chain

    for cause in exception_chain(err):
        tb = cause.__traceback__
        while tb is not None:
            yield str(tb.tb_frame.f_globals.get("__name__", "")), tb.tb_frame.f_code.co_name
            tb = tb.tb_next


def _raised_by_task(err: BaseException) -> bool:
    return any(name == "run_job" for _, name in _frames(err))


def _from_command_line() -> bool:
    """Called under Hydra's command-line entry point (``hydra.main``'s ``_run_hydra``)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_run_hydra" and frame.f_globals.get("__name__") == "hydra._internal.utils":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _full_error_wanted() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def _exit(err: ConfigError) -> None:
    from dsconf.launch.entry import exit_with

    exit_with(str(err), EXIT_CONFIG_ERROR)
