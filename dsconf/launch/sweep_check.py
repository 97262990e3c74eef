"""A ``-m`` sweep of a dsconf app, checked before its first job starts: every job composed and validated as the
launcher would, every bad job named at once, nothing run. The composed configs are kept (``ComposedJobs``) so that
dsconf's launcher does not compose them again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from dsconf import hydra_private
from dsconf.errors import ConfigError, Problem


@dataclass
class ComposedJobs:
    """The jobs of one checked sweep: each job's overrides -> its composed config."""

    configs: Dict[Tuple[str, ...], Any] = field(default_factory=dict)

    def __contains__(self, overrides: Any) -> bool:
        return tuple(overrides) in self.configs

    def take(self, overrides: List[str]) -> Any:
        """The job's composed config (composing is most of a short job's start-up), or None."""
        return self.configs.pop(tuple(overrides), None)


def check_sweep(cfg: Any, config_loader: Any, arguments: List[str]) -> ComposedJobs:
    """Compose and validate every job of a basic-sweeper sweep (``arguments``: its params, then the command line's
    overrides); one ``ConfigError`` naming each bad job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dsconf.composition import exception_chain, hydra_error_with_overrides

    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(arguments))
    composed = ComposedJobs()
    problems: List[Problem] = []
    for num, job in enumerate(hydra_private.split_sweep(parsed)):
        where = f"job #{num} ({' '.join(job)})"
        try:
            job_cfg = config_loader.load_sweep_config(cfg, list(job))
            composed.configs[tuple(job)] = job_cfg
            validate_job(job_cfg)
        except ConfigError as err:
            problems += [Problem(p.path, f"{where}: {p.message}", p.hint) for p in err.problems]
        except Exception as err:
            if not hydra_private.raised_while_composing(exception_chain(err)):
                raise
            problem = hydra_error_with_overrides(err, list(job), cfg).problems[0]
            problems.append(Problem(problem.path, f"{where}: {problem.message}", problem.hint))
    if problems:
        raise ConfigError(problems)
    return composed


def validate_job(job_cfg: Any) -> None:
    """What the launcher checks before starting a job's ranks: ``dist``, then the DeepSpeed dict per world size."""
    from omegaconf import OmegaConf

    from dsconf.launch.hydra_support import as_sweep_job, task_cfg
    from dsconf.launch.job_export import export_for_world_sizes
    from dsconf.launch.plan import dist_settings, plan_job

    launcher_dist = OmegaConf.select(job_cfg, "hydra.launcher.dist")  # hydra/launcher=dsconf's defaults
    task = task_cfg(job_cfg)
    plan = plan_job(dist_settings(task, launcher_dist))
    with as_sweep_job(job_cfg):  # ${hydra:...} in the task's config (HF's output_dir) resolves as in the job
        export_for_world_sizes(task, plan.world_sizes, plan)
