"""`import dsconf` stays light: no torch, no deepspeed, not even Hydra's composition machinery."""

from __future__ import annotations

import subprocess
import sys


def _imported_modules(statement: str) -> str:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True,
                          check=True)
    return proc.stderr


def _top_level(importtime_output: str) -> set:
    names = set()
    for line in importtime_output.splitlines():
        if "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


TOOLS = {"transformers", "accelerate", "lightning", "optuna"}


def test_import_dsconf_imports_no_torch_or_deepspeed():
    modules = _top_level(_imported_modules("import dsconf"))
    assert "dsconf" in modules
    assert not {"torch", "deepspeed", "hydra"} & modules
    assert not TOOLS & modules


def test_integrations_import_their_tool_only_when_used():
    modules = _top_level(_imported_modules(
        "import dsconf.integrations.hf, dsconf.integrations.accelerate, dsconf.integrations.lightning; "
        "dsconf.compose(['zero=stage2', 'deepspeed.train_micro_batch_size_per_gpu=2'])"))
    assert "dsconf" in modules
    assert not (TOOLS | {"torch", "deepspeed"}) & modules


def test_hydra_plugin_module_imports_no_torch():
    modules = _top_level(_imported_modules("import hydra_plugins.dsconf_launcher.config"))
    assert "hydra" in modules
    assert not {"torch", "deepspeed"} & modules


def test_the_tuner_plugin_imports_no_torch_or_optuna_at_discovery():
    modules = _top_level(_imported_modules("import hydra_plugins.dsconf_tune.config, "
                                           "hydra_plugins.dsconf_tune.dsconf_tune_sweeper"))
    assert "hydra" in modules
    assert not {"torch", "deepspeed", "optuna", "sqlalchemy", "matplotlib"} & modules


def test_composing_imports_no_torch():
    modules = _top_level(_imported_modules(
        "import dsconf; dsconf.compose(['zero=stage2', 'deepspeed.train_micro_batch_size_per_gpu=2'])"))
    assert not {"torch", "deepspeed"} & modules


def test_validating_and_importing_files_imports_no_torch(tmp_path):
    """`dsconf validate` and `dsconf import` over the whole corpus of real configs: no torch, no deepspeed."""
    from pathlib import Path

    corpus = sorted(str(p) for p in (Path(__file__).parent / "corpus").glob("*.json"))
    statement = ("import sys; from dsconf.cli import main; "
                 f"main(['validate', '--keep-auto', *{corpus!r}]); "
                 f"main(['import', {corpus[0]!r}, '-o', {str(tmp_path / 'out.yaml')!r}])")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True)
    modules = _top_level(proc.stderr)
    assert "dsconf" in modules and (tmp_path / "out.yaml").exists()
    assert not {"torch", "deepspeed"} & modules
