"""hydra-core's shared launcher suites against ``hydra/launcher=dsconf``, with 1 and with 2 ranks per job.

Parametrized the way Hydra's joblib and submitit plugins run them. The suites' task functions are closures
and one registers a resolver at run time: ranks started by ``fork`` (``start_method=auto`` on this GPU-less
host) inherit them; the ``spawn`` tests at the end show them arriving by cloudpickle + Hydra's singleton state.
"""

from __future__ import annotations

from pathlib import Path

import launch_helpers  # noqa: F401  (puts the repo on sys.path/PYTHONPATH for the suites' subprocesses)
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
    sweep_2_jobs,
)
from hydra.test_utils.test_utils import TSweepRunner
from pytest import fixture, mark, param

from hydra_plugins.dsconf_launcher.dsconf_launcher import DsconfLauncher

ONE_RANK = ["hydra.launcher.dist.nproc_per_node=1"]
TWO_RANKS = ["hydra.launcher.dist.nproc_per_node=2"]
SPAWN_ONE_RANK = ONE_RANK + ["hydra.launcher.dist.start_method=spawn"]
SPAWN_TWO_RANKS = TWO_RANKS + ["hydra.launcher.dist.start_method=spawn"]


@fixture(autouse=True)
def pristine_hydra_version_base():
    """The suites expect Hydra's compat defaults (no version_base set yet in this process, so
    hydra.job.chdir defaults to True); an earlier test that composed with version_base=None must not leak in."""
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase

    saved = Singleton._instances.pop(VersionBase, None)
    yield
    if saved is not None:
        Singleton._instances[VersionBase] = saved


def test_discovery() -> None:
    assert DsconfLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]


# slow: every test of the suites runs jobs (2 to 10 s each); the quick subset keeps test_discovery, and reaches the
# launcher through tests/launch/test_command_line.py's sweeps (each job checked by it) and test_launch_core.py
@mark.parametrize("launcher_name, overrides", [param("dsconf", ONE_RANK, id="1-rank"),
                                                param("dsconf", TWO_RANKS, id="2-ranks")])
@mark.slow
class TestDsconfLauncher(LauncherTestSuite):
    pass


@mark.parametrize("launcher_name, overrides", [
    param("dsconf", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2", *ONE_RANK], id="1-rank"),
    param("dsconf", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2", *TWO_RANKS], id="2-ranks"),
])
@mark.slow
class TestDsconfLauncherBatched(BatchedSweeperTestSuite):
    pass


@mark.parametrize("task_launcher_cfg, extra_flags", [
    param({}, ["-m", "hydra/launcher=dsconf", *ONE_RANK], id="1-rank"),
    param({}, ["-m", "hydra/launcher=dsconf", *TWO_RANKS], id="2-ranks"),
])
@mark.slow
class TestDsconfLauncherIntegration(IntegrationTestSuite):
    pass


@mark.slow
@mark.usefixtures("hydra_restore_singletons")
def test_spawned_ranks_get_the_suites_closure(hydra_sweep_runner: TSweepRunner, tmpdir: Path) -> None:
    sweep_2_jobs(hydra_sweep_runner, overrides=["hydra/launcher=dsconf", *SPAWN_ONE_RANK],
                 task_function=LauncherTestSuite().get_task_function(), temp_dir=tmpdir)


@mark.slow
@mark.usefixtures("hydra_restore_singletons")
def test_spawned_ranks_get_a_resolver_registered_at_run_time(hydra_sweep_runner: TSweepRunner, tmpdir: Path) -> None:
    LauncherTestSuite().test_sweep_with_custom_resolver(hydra_sweep_runner, "dsconf", list(SPAWN_TWO_RANKS), tmpdir)
