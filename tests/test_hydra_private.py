"""Each thing of Hydra's (and OmegaConf's) private API that ``dsconf.hydra_private`` relies on, checked by name: a
Hydra release that changes one fails here first, saying which. And the wrapping is Hydra's own methods again as
soon as an app that is not dsconf's is created."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest
from hydra._internal.config_search_path_impl import ConfigSearchPathImpl

from dsconf import hydra_private
from dsconf.config_source import dsconf_app
from dsconf.launch.command_line import WRAPPERS, on_search_path

# Patch -> the parameters dsconf's wrapper takes and hands on
SIGNATURES = {
    hydra_private.HYDRA_RUN: ["self", "config_name", "task_function", "overrides", "with_log_configuration"],
    hydra_private.HYDRA_MULTIRUN: ["self", "config_name", "task_function", "overrides", "with_log_configuration"],
    hydra_private.HYDRA_FORMAT_CONFIG_GROUPS: ["self", "predicate", "compact"],
    hydra_private.PLUGINS_INSTANTIATE_SWEEPER: ["self", "hydra_context", "task_function", "config"],
    hydra_private.SWEEPER_VALIDATE_BATCH: ["self", "batch"],
    hydra_private.COMPLETION_GET_MATCHES: ["config", "word"],
}


def test_every_patch_has_its_expected_signature() -> None:
    assert set(SIGNATURES) == set(hydra_private.PATCHES) == set(WRAPPERS)
    hydra_private.restore()  # Hydra's own methods (an earlier dsconf app in this process may have wrapped them)
    for patch, params in SIGNATURES.items():
        raw = patch.owner_class().__dict__.get(patch.name)
        assert raw is not None, f"{patch.module}.{patch.owner}.{patch.name} is gone"
        assert isinstance(raw, staticmethod) == patch.static, patch
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        names = [p for p in inspect.signature(fn).parameters if p not in ("args", "kwargs")]
        assert names == params, f"{patch.owner}.{patch.name}{inspect.signature(fn)} changed"


def test_apply_wraps_and_restore_puts_back_hydras_own_methods() -> None:
    hydra_private.restore()  # an earlier dsconf app in this process may have wrapped them
    before = {p: p.owner_class().__dict__[p.name] for p in hydra_private.PATCHES}
    hydra_private.apply(WRAPPERS)
    try:
        assert set(hydra_private.applied()) == set(hydra_private.PATCHES)
        for patch in hydra_private.PATCHES:
            assert patch.owner_class().__dict__[patch.name] is not before[patch]
        hydra_private.apply(WRAPPERS)  # a second call wraps nothing twice
        assert len(hydra_private.applied()) == len(hydra_private.PATCHES)
    finally:
        hydra_private.restore()
    assert hydra_private.applied() == []
    for patch in hydra_private.PATCHES:
        assert patch.owner_class().__dict__[patch.name] is before[patch]


def test_the_frames_relied_on_exist() -> None:
    for module in hydra_private.COMPOSING_MODULES:
        assert importlib.util.find_spec(module) is not None, module
    run_job = importlib.import_module("hydra.core.utils").run_job
    assert run_job.__name__ == hydra_private.TASK_FRAME
    module, function = hydra_private.HYDRA_MAIN_FRAME
    run_hydra = getattr(importlib.import_module(module), function)
    assert "config_name" in run_hydra.__code__.co_varnames  # hydra_main_config_name reads it
    # and _run_hydra creates the search path (so calls on_search_path) before it runs the app, inside its frame
    source = inspect.getsource(run_hydra)
    assert source.index("create_automatic_config_search_path(") < source.index("_run_app(")
    assert "hydra.run(" in inspect.getsource(importlib.import_module(module)._run_app)


def test_a_composition_error_is_told_from_a_task_error() -> None:
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    from dsconf.composition import exception_chain

    GlobalHydra.instance().clear()
    with initialize(version_base=None, config_path=None):
        with pytest.raises(Exception) as info:
            compose(config_name="no_such_config")
    chain = exception_chain(info.value)
    assert hydra_private.raised_while_composing(chain) and not hydra_private.raised_by_task(chain)


def test_split_sweep_and_basic_sweeper_params() -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y", "c=3"])
    assert hydra_private.split_sweep(parsed) == [["a=1", "b=x", "c=3"], ["a=1", "b=y", "c=3"],
                                                 ["a=2", "b=x", "c=3"], ["a=2", "b=y", "c=3"]]
    sweeper = BasicSweeper(max_batch_size=None, params={"a": "1,2"})
    assert hydra_private.is_basic_sweeper(sweeper)
    assert hydra_private.basic_sweeper_params(sweeper) == ["a=1,2"]
    assert hasattr(sweeper, "launcher") and hydra_private.sweeper_launcher(sweeper) is None  # set by setup()


def test_restore_singletons_installs_a_parents_state() -> None:
    from hydra.core.config_store import ConfigStore
    from hydra.core.singleton import Singleton
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer

    assert isinstance(Singleton._instances, dict) and isinstance(BaseContainer._resolvers, dict)
    state = Singleton.get_state()
    ConfigStore.instance().store(name="_probe_after_state", node={"x": 1})
    OmegaConf.register_new_resolver("_probe_resolver", lambda: 1, replace=True)
    hydra_private.restore_singletons(state)
    assert "_probe_after_state.yaml" not in ConfigStore.instance().repo
    assert not OmegaConf.has_resolver("_probe_resolver")


def _search_path(main: Path) -> ConfigSearchPathImpl:
    search_path = ConfigSearchPathImpl()
    search_path.append("hydra", "pkg://hydra.conf")
    search_path.append("main", str(main))
    return search_path


def test_on_search_path_wraps_only_for_dsconf_apps(tmp_path: Path) -> None:
    plain, ours = tmp_path / "plain", tmp_path / "ours"
    plain.mkdir()
    ours.mkdir()
    (plain / "config.yaml").write_text("defaults:\n  - optimizer: adam\n")
    (ours / "config.yaml").write_text("defaults:\n  - dsconf\n  - _self_\n")
    try:
        search_path = _search_path(ours)
        on_search_path(search_path)
        assert set(hydra_private.applied()) == set(hydra_private.PATCHES)
        assert [e.path for e in search_path.get_path()][-1] == "dsconf://"
        search_path = _search_path(plain)  # the next app in the same process is not dsconf's
        on_search_path(search_path)
        assert hydra_private.applied() == []
        assert [e.path for e in search_path.get_path()] == ["pkg://hydra.conf", str(plain)]
        with dsconf_app():  # @dsconf.main or dsconf's own API: whatever its config dir holds
            on_search_path(_search_path(plain))
        assert set(hydra_private.applied()) == set(hydra_private.PATCHES)
    finally:
        hydra_private.restore()
