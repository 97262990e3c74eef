"""dsconf installs so that Hydra finds its plugin, in every way a user installs it.

Hydra finds plugins by walking the ``hydra_plugins`` namespace package with ``pkgutil.walk_packages``.
setuptools' default editable install (an import-hook finder) hides a project's ``hydra_plugins/`` from
that walk, which is why the project builds with hatchling and a static ``.pth`` (see pyproject.toml).
Each install mode is checked in a fresh virtual environment, from a working directory outside the repo:

* ``pip install -e .`` (default editable),
* ``pip install -e . --config-settings editable_mode=compat``,
* a wheel built from the work tree.

The fresh environments reuse the test runner's site-packages through a ``.pth`` file (hydra, omegaconf,
torch, the build backend), so nothing is downloaded; only dsconf itself is installed into them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_PACKAGE = "hydra_plugins.dsconf_launcher"
LAUNCHER_MODULE = f"{PLUGIN_PACKAGE}.dsconf_launcher"
SWEEPER_CLASS = "hydra_plugins.dsconf_tune.dsconf_tune_sweeper.DsconfTuneSweeper"
LAUNCHER_CLASS = f"{LAUNCHER_MODULE}.DsconfLauncher"
MODES = ["editable", "editable-compat", "wheel"]

# Run in the fresh environment. Imports nothing from dsconf by hand: plugin discovery must be what
# imports the plugin package and so puts dsconf's config source on the search path of Hydra's compose API.
DISCOVER_AND_COMPOSE = textwrap.dedent(
    """
    import json, sys
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    out = {"dsconf_imported_before_discovery": "dsconf" in sys.modules}
    launchers = Plugins.instance().discover(Launcher)
    out["launchers"] = [f"{p.__module__}.{p.__name__}" for p in launchers]
    from hydra.plugins.sweeper import Sweeper
    out["sweepers"] = [f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(Sweeper)]

    from hydra import compose, initialize
    try:
        with initialize(version_base=None, config_path=None):
            cfg = compose(config_name="dsconf", overrides=["zero=stage2"])
        out["stage"] = cfg.deepspeed.zero_optimization.stage
    except Exception as e:
        out["stage"] = f"compose failed: {type(e).__name__}: {e}"

    import importlib
    out["plugin_file"] = importlib.import_module("hydra_plugins.dsconf_launcher").__file__
    out["dsconf_file"] = importlib.import_module("dsconf").__file__
    print("RESULT " + json.dumps(out))
    """
)

IMPORT_WITHOUT_TORCH = textwrap.dedent(
    f"""
    import json, sys
    import {LAUNCHER_MODULE}
    heavy = sorted(m for m in ("torch", "deepspeed") if m in sys.modules)
    print("RESULT " + json.dumps({{"heavy": heavy}}))
    """
)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX"))}
    env.update(
        PYTHONNOUSERSITE="1",  # no user site-packages leaking in
        PIP_NO_INPUT="1",
        PIP_NO_INDEX="1",  # everything needed is local: never reach a package registry
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        HYDRA_FULL_ERROR="1",
    )
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 180) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"script printed no result:\n{stdout}"
    return json.loads(lines[-1][len("RESULT ") :])


def _runner_site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _require_backend() -> None:
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling (the build backend) is missing from the test environment: pip install -e '.[dev]'")


def test_layout_keeps_hydra_plugins_a_namespace_package():
    # An __init__.py here would shadow every other installed Hydra plugin (and hide ours from theirs).
    assert not (REPO / "hydra_plugins" / "__init__.py").exists()
    assert (REPO / "hydra_plugins" / "dsconf_launcher" / "__init__.py").is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the current work tree, built once for the module."""
    _require_backend()
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        cwd=out,
    )
    (whl,) = out.glob("dsconf-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "dsconf/__init__.py" in names
    assert "hydra_plugins/dsconf_launcher/__init__.py" in names
    assert "hydra_plugins/dsconf_launcher/dsconf_launcher.py" in names
    assert {"hydra_plugins/dsconf_tune/config.py", "hydra_plugins/dsconf_tune/dsconf_tune_sweeper.py",
            "dsconf/tune/study.py", "dsconf/launch/trial_meter.py"} <= set(names)
    assert "hydra_plugins/__init__.py" not in names
    # conf/, tests/, examples/ and benchmarks/ are not shipped.
    extra = {n.split("/", 1)[0] for n in names} - {"dsconf", "hydra_plugins"}
    assert all(top.endswith(".dist-info") for top in extra), extra
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "dsconf = dsconf.cli:main" in entry_points


@pytest.fixture(scope="module", params=MODES)
def installed(request, tmp_path_factory, wheel) -> tuple[str, Path, Path]:
    """A fresh venv with dsconf installed in one mode: (mode, venv, a working directory outside the repo)."""
    mode = request.param
    root = tmp_path_factory.mktemp(f"venv-{mode}")
    venv = root / "venv"
    work = root / "work"
    work.mkdir()
    assert REPO not in work.parents, "the working directory must be outside the repository"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    python = _venv_python(venv)
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).strip()
    # Sorted after the editable install's own .pth, so the runner's packages come last on sys.path.
    Path(purelib, "zz_dsconf_test_runner_site.pth").write_text("\n".join(_runner_site_dirs()) + "\n")

    # The runner's pip (reached through the .pth) installs into the venv it runs in. --ignore-installed:
    # never touch a dsconf the runner's own environment may hold.
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--ignore-installed"]
    if mode == "editable":
        _run([*pip, "-e", str(REPO)], cwd=work)
    elif mode == "editable-compat":
        _run([*pip, "-e", str(REPO), "--config-settings", "editable_mode=compat"], cwd=work)
    else:
        _run([*pip, str(wheel)], cwd=work)
    return mode, venv, work


@pytest.mark.slow
def test_plugin_discovered_and_configs_composable(installed):
    mode, venv, work = installed
    out = _result(_run([str(_venv_python(venv)), "-c", DISCOVER_AND_COMPOSE], cwd=work))

    assert not out["dsconf_imported_before_discovery"]
    assert LAUNCHER_CLASS in out["launchers"], f"{mode}: Hydra did not discover the dsconf launcher: {out}"
    assert SWEEPER_CLASS in out["sweepers"], f"{mode}: Hydra did not discover the dsconf tuner: {out}"
    assert out["stage"] == 2, f"{mode}: {out['stage']}"

    # The install really is the one under test, not the repo via the working directory or the runner's env.
    expected_root = REPO if mode.startswith("editable") else venv.resolve()
    for key in ("plugin_file", "dsconf_file"):
        assert Path(out[key]).resolve().is_relative_to(expected_root), f"{mode}: {key} = {out[key]}"


@pytest.mark.slow
def test_launcher_module_imports_without_torch(installed):
    mode, venv, work = installed
    out = _result(_run([str(_venv_python(venv)), "-c", IMPORT_WITHOUT_TORCH], cwd=work))
    assert out["heavy"] == [], f"{mode}: importing {LAUNCHER_MODULE} imported {out['heavy']}"


@pytest.mark.slow
def test_console_script_installed(installed):
    mode, venv, _ = installed
    script = venv / ("Scripts/dsconf.exe" if os.name == "nt" else "bin/dsconf")
    assert script.is_file(), f"{mode}: no dsconf console script"
