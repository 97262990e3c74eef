"""dsconf is a good neighbour: installing it changes nothing for a Hydra app that does not use it.

Third-party-shaped apps (groups named like dsconf's: ``optimizer``, ``scheduler``, ``precision``, plus ``model`` and
``trainer``; options ``adam``, ``sgd``, ``none``, ``fp16``) and Hydra's own example apps run as subprocesses, once
with dsconf importable and once without it, and must print the same bytes: single runs, ``-m``, ``--help``, ``--cfg
job``, ``--info searchpath``, shell completion, typos and options that only dsconf has. dsconf apps, on the other
hand, get dsconf's groups however they name ``dsconf``, and an option of their own that would shadow one of
dsconf's is a one-line error."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = sysconfig.get_paths()["purelib"]
HYDRA_TEST_UTILS = Path(importlib.util.find_spec("hydra.test_utils").origin).parent

YAML_APP = """
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg):
    print(OmegaConf.to_yaml(cfg))
    print("choices", dict(HydraConfig.get().runtime.choices))

if __name__ == "__main__":
    main()
"""
YAML_CONF = {
    "config.yaml": "defaults:\n  - optimizer: adam\n  - scheduler: none\n  - precision: fp16\n  - model: resnet\n"
                   "  - trainer: default\n  - _self_\nseed: 1\n",
    "optimizer/adam.yaml": "name: adam\nlr: 0.001\n",
    "optimizer/sgd.yaml": "name: sgd\nlr: 0.1\nmomentum: 0.9\n",
    "optimizer/none.yaml": "name: none\n",
    "scheduler/none.yaml": "name: none\n",
    "scheduler/cosine.yaml": "name: cosine\nwarmup: 10\n",
    "precision/fp16.yaml": "dtype: float16\n",
    "precision/fp32.yaml": "dtype: float32\n",
    "model/resnet.yaml": "depth: 50\n",
    "model/none.yaml": "depth: 0\n",
    "trainer/default.yaml": "max_epochs: 3\n",
}

# Structured configs only (config_path=None), as hydra-zen style apps are.
STRUCTURED_APP = """
from dataclasses import dataclass, field
from typing import Any, List
import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

@dataclass
class Adam:
    lr: float = 0.001

@dataclass
class Sgd:
    lr: float = 0.1
    momentum: float = 0.9

@dataclass
class Fp16:
    dtype: str = "float16"

@dataclass
class Config:
    defaults: List[Any] = field(default_factory=lambda: [{"optimizer": "adam"}, {"precision": "fp16"}, "_self_"])
    seed: int = 1

cs = ConfigStore.instance()
cs.store(group="optimizer", name="adam", node=Adam)
cs.store(group="optimizer", name="sgd", node=Sgd)
cs.store(group="precision", name="fp16", node=Fp16)
cs.store(name="config", node=Config)

@hydra.main(config_path=None, config_name="config", version_base=None)
def main(cfg):
    print(OmegaConf.to_yaml(cfg))

if __name__ == "__main__":
    main()
"""

# Hydra's compose API, as tests and notebooks use it; an error is printed, not raised, to compare its text.
COMPOSE_APP = """
import sys
from hydra import compose, initialize
from omegaconf import OmegaConf

try:
    with initialize(config_path=sys.argv[1] or None, version_base=None):
        print(OmegaConf.to_yaml(compose(config_name=sys.argv[2], overrides=sys.argv[3:])))
except Exception as err:
    print(type(err).__name__, err)
"""

# Hydra's own completion test configs (shipped with hydra-core), behind a plain app.
COMPLETION_APP = f"""
import hydra
from omegaconf import OmegaConf

@hydra.main(config_path={str(HYDRA_TEST_UTILS / 'configs' / 'completion_test')!r}, config_name="config",
            version_base=None)
def main(cfg):
    print(OmegaConf.to_yaml(cfg))

if __name__ == "__main__":
    main()
"""

RUNS = [[], ["optimizer=sgd", "precision=fp32", "model=none"], ["optimizer=lamb"], ["optimizer=torch"],
        ["zero=stage2"], ["+zero=stage2"], ["optimzer=sgd"], ["seed=2", "deepspeed.fp16.enabled=true"],
        ["--help"], ["--cfg", "job"], ["--info", "searchpath"], ["--info", "defaults"],
        ["-m", "optimizer=adam,sgd", "scheduler=none,cosine"], ["-m", "optimizer=adam,lamb"]]
COMPLETIONS = ["", "opt", "optimizer=", "ze", "zero=", "precision=", "deepspeed.", "sc"]
_TIME = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\]")


# Runs each app invocation in a forked child of one warm interpreter per environment (Hydra imported once), as
# ``python app.py ARGS`` or ``python -m MODULE ARGS`` would: same argv, working dir and environment variables.
DRIVER = """
import importlib, io, json, os, pkgutil, runpy, sys, tempfile, traceback
import hydra, hydra_plugins, omegaconf
# warm: the other plugins' modules (and what they import) once, before any app runs; never dsconf's
for info in pkgutil.walk_packages(hydra_plugins.__path__, "hydra_plugins."):
    if not info.name.startswith("hydra_plugins.dsconf") and not info.name.rsplit(".", 1)[-1].startswith("_"):
        try:
            importlib.import_module(info.name)
        except Exception:
            pass
jobs = json.load(open(sys.argv[1]))
results = []
for job in jobs:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
        code = 0
        try:
            if job["module"]:
                sys.argv = [job["module"], *job["args"]]
                runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
            else:
                sys.argv = job["args"]
                sys.path.insert(0, os.path.dirname(os.path.abspath(job["args"][0])))
                runpy.run_path(job["args"][0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
    results.append({"code": os.waitstatus_to_exitcode(status), "stdout": texts[0], "stderr": texts[1]})
json.dump(results, open(sys.argv[2], "w"))
"""


def _env(with_dsconf: bool) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HYDRA_", "COMP_"))}
    env["PYTHONPATH"] = os.pathsep.join([SITE, str(REPO)] if with_dsconf else [SITE])
    return env


def run_jobs(jobs: List[Dict[str, Any]], *, with_dsconf: bool, work: Path) -> List[str]:
    """Each job's exit code, stdout and stderr (log timestamps masked), run by ``python -S`` (no site: only
    PYTHONPATH, so that dsconf's editable path can be left out)."""
    tag = "with" if with_dsconf else "without"
    (work / "driver.py").write_text(DRIVER)
    (work / f"jobs-{tag}.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, "-S", str(work / "driver.py"), str(work / f"jobs-{tag}.json"),
                           str(work / f"results-{tag}.json")], env=_env(with_dsconf), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((work / f"results-{tag}.json").read_text())
    return [_TIME.sub("[TIME]", f"exit {r['code']}\n--- stdout\n{r['stdout']}--- stderr\n{r['stderr']}")
            for r in results]


def job(cwd: Path, *args: str, module: str = "", env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    return {"cwd": str(cwd), "args": list(args), "module": module, "env": env or {}}


def _write(root: Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


RUN_ARGS = ["hydra.run.dir=out", "hydra.sweep.dir=multi"]
CASES: Dict[str, Callable[[Dict[str, Path]], Dict[str, Any]]] = {}
for _app in ("yaml_app", "structured_app"):
    for _args in RUNS:
        CASES[f"{_app}: {' '.join(_args) or 'no overrides'}"] = (
            lambda apps, a=_app, r=_args: job(apps[a], "app.py", *r, *RUN_ARGS))
for _app in ("yaml_app", "structured_app", "completion_app"):
    for _line in COMPLETIONS:
        CASES[f"{_app}: complete {_line!r}"] = (lambda apps, a=_app, li=_line: job(
            apps[a], "app.py", "-sc", "query=bash",
            env={"COMP_LINE": f"python app.py {li}", "COMP_POINT": str(len(f"python app.py {li}"))}))
for _args in ([], ["db=postgresql"], ["db=mysqll"], ["zero=stage2"], ["--help"], ["--cfg", "job"],
              ["-m", "db=mysql,postgresql"]):
    CASES[f"hydra's example_app: {' '.join(_args) or 'no overrides'}"] = (
        lambda apps, r=_args: job(apps["yaml_app"], *r, *RUN_ARGS, module="hydra.test_utils.example_app"))
for _overrides in ([], ["optimizer=sgd"], ["optimizer=lamb"], ["zero=stage2"]):
    CASES[f"compose API, conf/config: {' '.join(_overrides)}"] = (
        lambda apps, o=_overrides: job(apps["compose_app"], "app.py", "conf", "config", *o))
    CASES[f"compose API, no config dir: {' '.join(_overrides)}"] = (
        lambda apps, o=_overrides: job(apps["compose_app"], "app.py", "", "config", *o))
CASES["yaml_app: --hydra-help"] = lambda apps: job(apps["yaml_app"], "app.py", "--hydra-help")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, tuple]:
    """Every case run without dsconf, then with it: case -> (output without, output with)."""
    root = tmp_path_factory.mktemp("neighbours")
    _write(root / "yaml_app", {"app.py": YAML_APP, **{f"conf/{k}": v for k, v in YAML_CONF.items()}})
    _write(root / "structured_app", {"app.py": STRUCTURED_APP})
    _write(root / "compose_app", {"app.py": COMPOSE_APP, **{f"conf/{k}": v for k, v in YAML_CONF.items()}})
    _write(root / "completion_app", {"app.py": COMPLETION_APP})
    apps = {p.name: p for p in root.iterdir() if p.is_dir()}
    probe = root / "probe.py"
    probe.write_text("import importlib.util as u; print(bool(u.find_spec('dsconf')), bool(u.find_spec('hydra')))\n")
    jobs = [job(root, str(probe))] + [make(apps) for make in CASES.values()]
    without = run_jobs(jobs, with_dsconf=False, work=root)
    with_ = run_jobs(jobs, with_dsconf=True, work=root)
    return {"probe": (without[0], with_[0]), **{name: pair for name, pair in zip(CASES, zip(without[1:], with_[1:]))}}


@pytest.mark.slow  # the outputs fixture: every app run twice
def test_the_two_environments_differ_only_in_dsconf(outputs) -> None:
    without, with_ = outputs["probe"]
    assert "True True" in with_
    # dsconf installed into site-packages (not from this checkout) would make the comparison meaningless
    assert "False True" in without


@pytest.mark.parametrize("case", [c for c in CASES if "--hydra-help" not in c and "no config dir" not in c])
@pytest.mark.slow
def test_a_hydra_app_that_does_not_use_dsconf_runs_byte_identical_with_it_installed(outputs, case):
    without, with_ = outputs[case]
    assert with_ == without
    if "complete" in case:
        assert with_.startswith("exit 0"), with_


@pytest.mark.parametrize("case", [c for c in CASES if "no config dir" in c])
@pytest.mark.slow
def test_the_compose_api_without_a_config_dir_differs_only_in_the_search_path_it_prints(outputs, case):
    """Hydra's compose API without a config dir names its primary config only when it composes, so dsconf's
    source is on its search path in case that is ``dsconf``; it serves nothing else, and shows only there."""
    without, with_ = outputs[case]
    assert with_.replace("\tprovider=dsconf, path=dsconf://until-composed\n", "") == without
    assert "Cannot find primary config 'config'" in without


@pytest.mark.slow
def test_hydra_help_differs_only_by_the_dsconf_launcher_and_sweeper_options(outputs):
    """What any launcher or sweeper plugin adds: its name among the options of its group, nothing else."""
    without, with_ = outputs["yaml_app: --hydra-help"]
    changed = [(a, b) for a, b in zip(without.splitlines(), with_.splitlines()) if a != b]
    assert len(without.splitlines()) == len(with_.splitlines()) and len(changed) == 2, changed
    added = {}
    for before, after in changed:
        group = before.split(": ", 1)[0]
        assert after.startswith(f"{group}: "), changed
        options = [set(line.split(": ", 1)[1].split(", ")) for line in (before, after)]
        assert options[0] <= options[1], changed
        added[group] = options[1] - options[0]
    assert added == {"hydra/launcher": {"dsconf"}, "hydra/sweeper": {"dsconf_tune"}}, changed


# --- dsconf apps ---------------------------------------------------------------------------------------------

DSCONF_APP = """
import dsconf
from omegaconf import OmegaConf

@dsconf.main(config_path="conf", config_name="{name}", version_base=None)
def main(cfg):
    print("STAGE", cfg.deepspeed.zero_optimization.stage, "OPT", cfg.deepspeed.optimizer.type)

if __name__ == "__main__":
    main()
"""
PLAIN_APP = YAML_APP.replace('config_name="config"', 'config_name="{name}"').replace(
    'print(OmegaConf.to_yaml(cfg))', 'print("STAGE", cfg.deepspeed.zero_optimization.stage)')


def _run_dsconf_app(tmp_path: Path, source: str, files: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    _write(tmp_path, {"app.py": source, **files})
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "HYDRA_FULL_ERROR": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "app.py", *args, "hydra.run.dir=out", "hydra.sweep.dir=multi",
                           "deepspeed.train_micro_batch_size_per_gpu=1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)


LISTS_DSCONF = "defaults:\n  - dsconf\n  - _self_\n"


@pytest.mark.parametrize("source", [DSCONF_APP, PLAIN_APP], ids=["dsconf.main", "hydra.main"])
def test_an_app_option_shadowing_one_of_dsconfs_is_a_one_line_error(source, tmp_path):
    files = {"conf/job.yaml": LISTS_DSCONF, "conf/optimizer/adam.yaml": "type: MyAdam\n"}
    proc = _run_dsconf_app(tmp_path, source.replace("{name}", "job"), files)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsconf: "), proc.stderr
    assert "optimizer=adam" in lines[0] and "optimizer/adam" in lines[0] and "rename" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "STAGE" not in proc.stdout


@pytest.mark.slow  # starts a rank
def test_an_app_option_of_a_new_name_extends_dsconfs_group(tmp_path):
    files = {"conf/job.yaml": LISTS_DSCONF,
             "conf/zero/my_stage.yaml": "# @package deepspeed.zero_optimization\nstage: 2\n"}
    proc = _run_dsconf_app(tmp_path, DSCONF_APP.replace("{name}", "job"), files, "zero=my_stage")
    assert proc.returncode == 0, proc.stderr
    assert "STAGE 2 OPT Adam" in proc.stdout


@pytest.mark.parametrize("how", ["yaml-defaults", "flow-style-defaults", "config-dir", "primary-is-dsconf"])
def test_a_plain_hydra_app_that_names_dsconf_gets_its_groups(how, tmp_path):
    files: Dict[str, str] = {"conf/job.yaml": LISTS_DSCONF,
                             "conf/flow.yaml": "defaults: [dsconf, _self_]\n",
                             "other/elsewhere.yaml": LISTS_DSCONF}
    name, extra = {"yaml-defaults": ("job", []), "flow-style-defaults": ("flow", []),
                   "config-dir": ("elsewhere", ["--config-dir", "other"]),
                   "primary-is-dsconf": ("dsconf", [])}[how]
    source = PLAIN_APP.replace("{name}", name)
    if how == "primary-is-dsconf":
        source = source.replace('config_path="conf"', "config_path=None")
    proc = _run_dsconf_app(tmp_path, source, files, *extra, "zero=stage3")
    assert proc.returncode == 0, proc.stderr
    assert "STAGE 3" in proc.stdout
    # and a mistake is dsconf's one-line problem, not Hydra's report
    bad = _run_dsconf_app(tmp_path, source, files, *extra, "zero=stage5")
    assert bad.returncode == 2 and bad.stderr.startswith("dsconf: ") and "stage5" in bad.stderr, bad.stderr
