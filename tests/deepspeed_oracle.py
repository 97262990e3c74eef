"""DeepSpeed itself as the oracle: parse config dicts with ``DeepSpeedConfig`` at a given world size.

Used in-process for the installed DeepSpeed and as a script (``python deepspeed_oracle.py < cases.json``, or
``--serve``: one request a line, for a whole test session) under another DeepSpeed version's interpreter. It imports
nothing from dsconf.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import KeysView
from pathlib import Path
from typing import Any, Dict, Iterator, List
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")

STAGE3_ALIASES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}
SAME_NAME = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op", "steps_per_print",
             "wall_clock_breakdown", "dump_state", "gradient_clipping", "zero_allow_untested_optimizer",
             "zero_force_ds_cpu_optimizer", "managed_gradient_accumulation", "disable_allgather",
             "dataloader_drop_last", "memory_breakdown", "disable_python_gc", "log_level"]
# Top-level keys whose parsed attribute has another name.
RENAMED = {"use_data_before_expert_parallelism": "use_data_before_expert_parallel_"}
DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16",
          "float16": "torch.float16", "half": "torch.float16"}


def _plain(value: Any) -> Any:
    if hasattr(value, "value") and type(value).__module__ != "builtins" and not isinstance(value, (int, float)):
        return value.value  # enums
    if isinstance(value, int) and type(value) is not int and type(value) is not bool:
        return int(value)  # int enums such as ZeroStageEnum
    return value


def mismatches(given: Dict[str, Any], parsed: Any) -> List[str]:
    """Keys of ``given`` whose value differs from what DeepSpeed parsed."""
    out: List[str] = []

    def expect(path: str, want: Any, got: Any) -> None:
        got = _plain(got)
        if isinstance(want, float) or isinstance(got, float):
            same = want == got
        else:
            same = want == got and type(want) is type(got) if isinstance(want, bool) else want == got
        if not same:
            out.append(f"{path}: config {want!r} != DeepSpeed {got!r}")

    for key, value in given.items():
        if key in SAME_NAME:
            expect(key, value, getattr(parsed, key))
        elif key == "optimizer":
            name = parsed.optimizer_name
            expect("optimizer.type", value["type"].lower(), str(name).lower())
            expect("optimizer.params", value.get("params"), parsed.optimizer_params)
            if "legacy_fusion" in value:
                expect("optimizer.legacy_fusion", value["legacy_fusion"], parsed.optimizer_legacy_fusion)
        elif key == "scheduler":
            expect("scheduler.type", value["type"], parsed.scheduler_name)
            expect("scheduler.params", value.get("params"), parsed.scheduler_params)
        elif key in RENAMED:
            expect(key, value, getattr(parsed, RENAMED[key]))
        elif key in ("communication_data_type", "seq_parallel_communication_data_type"):
            expect(key, DTYPES[value.lower()], str(getattr(parsed, key)))
        elif key == "sparse_gradients":
            expect(key, value, parsed.sparse_gradients_enabled)
        elif key in ("fp16", "bf16"):
            model = parsed.float16_config if key == "fp16" else parsed.bfloat16_config
            for k, v in value.items():
                expect(f"{key}.{k}", v, getattr(model, k))
        elif key == "amp":
            expect("amp.enabled", value["enabled"], parsed.amp_enabled)
            expect("amp.params", {k: v for k, v in value.items() if k != "enabled"}, parsed.amp_params)
        elif key == "torch_autocast":
            expect("torch_autocast.enabled", value.get("enabled", False), parsed.torch_autocast_enabled)
            if "dtype" in value:
                expect("torch_autocast.dtype", DTYPES.get(value["dtype"], value["dtype"]),
                       str(parsed.torch_autocast_dtype))
        elif key == "zero_optimization" and isinstance(value, dict):  # (true/false: DeepSpeed's old form)
            for k, v in value.items():
                got = getattr(parsed.zero_config, STAGE3_ALIASES.get(k, k))
                if isinstance(v, dict):
                    for kk, vv in v.items():
                        expect(f"zero_optimization.{k}.{kk}", vv, got.get(kk) if isinstance(got, dict)
                               else getattr(got, kk))
                else:
                    expect(f"zero_optimization.{k}", v, got)
        elif key == "activation_checkpointing":
            for k, v in value.items():
                expect(f"activation_checkpointing.{k}", v, getattr(parsed.activation_checkpointing_config, k))
        elif key == "sparse_attention":
            expect("sparse_attention", value, parsed.sparse_attention)
        elif not isinstance(value, dict):
            out.append(f"{key}: no known DeepSpeed attribute to compare")
        # other sections are compared whole, through parsed_state (test_export's minimal-config oracle)
    return out


def plain_state(value: Any, depth: int = 0) -> Any:
    """A parsed DeepSpeed config object as plain JSON-able data (pydantic models dumped, enums and dtypes as text),
    so two parses can be compared whole."""
    if depth > 12:
        return repr(value)
    if hasattr(value, "model_dump"):
        return plain_state(value.model_dump(), depth + 1)
    if isinstance(value, dict):
        return {str(k): plain_state(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_state(v, depth + 1) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return _plain(value) if not isinstance(value, bool) else value
    if hasattr(value, "value") and type(value).__module__ != "builtins":
        return plain_state(value.value, depth + 1)
    if hasattr(value, "__dict__") and not callable(value):
        return {k: plain_state(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


# Attributes of a parsed config that hold the input itself, not what DeepSpeed made of it.
RAW_ATTRIBUTES = ("_param_dict",)


def parsed_state(parsed: Any) -> Dict[str, Any]:
    return {k: plain_state(v) for k, v in vars(parsed).items() if k not in RAW_ATTRIBUTES}


def parse(config: Dict[str, Any], world_size: int) -> Dict[str, Any]:
    """{"ok": bool, "error": str, "triple": [...], "mismatches": [...], "state": {...}} for one config at one
    world size; ``state`` is everything DeepSpeed parsed, as plain data."""
    import deepspeed.runtime.config as ds_config

    with mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        try:
            parsed = ds_config.DeepSpeedConfig(copy.deepcopy(config))
        except Exception as err:  # DeepSpeed raises AssertionError, ValueError, pydantic errors...
            return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {"ok": True, "error": "",
            "triple": [parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu,
                       parsed.gradient_accumulation_steps],
            "mismatches": mismatches(config, parsed), "state": parsed_state(parsed)}


# The classes DeepSpeed's engine builds for each optimizer name (deepspeed/runtime/engine.py,
# _configure_basic_optimizer): its fused GPU class and its CPU class for offload.
BUILT_OPTIMIZERS = {
    "Adam": ["deepspeed.ops.adam.FusedAdam", "deepspeed.ops.adam.DeepSpeedCPUAdam"],
    "AdamW": ["deepspeed.ops.adam.FusedAdam", "deepspeed.ops.adam.DeepSpeedCPUAdam"],
    "Lamb": ["deepspeed.ops.lamb.FusedLamb"],
    "Lion": ["deepspeed.ops.lion.FusedLion", "deepspeed.ops.lion.DeepSpeedCPULion"],
    "Adagrad": ["deepspeed.ops.adagrad.DeepSpeedCPUAdagrad"],
}

ORACLE = Path(__file__).resolve()


def ds0195_python() -> str:
    """Interpreter of the second environment with DeepSpeed 0.19.5 (set up by scripts/setup.sh)."""
    default = Path(__file__).resolve().parents[1] / ".venv-ds0195" / "bin" / "python"
    return os.environ.get("DSCONF_DS0195_PYTHON") or (str(default) if default.exists() else "")


# One oracle process per other interpreter, started on first use and kept for the test session (a worker's, under
# pytest-xdist): importing DeepSpeed and torch there is most of a call's time, and the tests call it a dozen times.
_SERVERS: Dict[str, Any] = {}
CALL_TIMEOUT_S = 600.0


def _server(python: str) -> Any:
    server = _SERVERS.get(python)
    if server is None or server.poll() is not None:
        log = tempfile.TemporaryFile(mode="w+")  # DeepSpeed's prints: a file, so no pipe fills and blocks it
        server = subprocess.Popen([python, str(ORACLE), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=log, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
        server.log = log  # type: ignore[attr-defined]
        _SERVERS[python] = server
    return server


def _stop_servers() -> None:
    for server in _SERVERS.values():
        if server.poll() is None:
            server.stdin.close()  # the server ends at end of input
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    _SERVERS.clear()


atexit.register(_stop_servers)


def parse_with_other_deepspeed(python: str, cases: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Run the oracle under another interpreter; cases are {"config": ..., "world_size": ...}. Each call is one
    request to that interpreter's oracle process, answered as a fresh ``python deepspeed_oracle.py`` would."""
    server = _server(python)

    def failure(why: str) -> str:
        server.log.seek(0)
        return f"the DeepSpeed oracle under {python} {why}:\n{server.log.read()[-3000:]}"

    try:
        server.stdin.write(json.dumps(cases) + "\n")
        server.stdin.flush()
    except BrokenPipeError:
        raise AssertionError(failure(f"exited ({server.wait()})")) from None
    ready, _, _ = select.select([server.stdout], [], [], CALL_TIMEOUT_S)
    line = server.stdout.readline() if ready else ""
    if not line:
        if server.poll() is None:
            server.kill()
            raise AssertionError(failure(f"did not answer within {CALL_TIMEOUT_S:.0f} s"))
        raise AssertionError(failure(f"exited ({server.wait()})"))
    return json.loads(line)


def installed_version() -> str:
    import deepspeed

    return deepspeed.__version__





# --- Which keys DeepSpeed reads: the verdict on a real config file --------------------------------------------

class RecordingDict(dict):
    """A config dict that records every key DeepSpeed looks up (get, [], in, keys, items, pop, setdefault), nested
    dicts too, as dotted paths in ``read`` (shared by the whole tree and its copies).

    ``passes_on_copies``: a copy of a section counts as reading all of it (DeepSpeed copies a section it hands on
    whole, e.g. data_efficiency's sampling settings); off, only explicit look-ups count.
    """

    def __init__(self, data: Dict[str, Any], path: str = "", log: Any = None, passes_on_copies: bool = True) -> None:
        self.__dict__["_path"] = path
        self.__dict__["_log"] = log if log is not None else set()
        self.__dict__["_passes_on_copies"] = passes_on_copies
        super().__init__({k: self._wrap(k, v) for k, v in data.items()})

    @property
    def read(self) -> set:
        return self._log

    def _wrap(self, key: str, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return RecordingDict(value, self._join(key), self._log, self._passes_on_copies)

    def _join(self, key: Any) -> str:
        return f"{self._path}.{key}" if self._path else str(key)

    def _read(self, key: Any) -> None:
        self._log.add(self._join(key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._read(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self._read(key)
        return super().__contains__(key)

    def keys(self):  # noqa: ANN201 - dict's own signature
        return _RecordingKeys(self)  # `key in d.keys()` reads one key; iterating reads them all

    def items(self):  # noqa: ANN201
        for key in super().keys():
            self._read(key)
        return super().items()

    def pop(self, key: Any, *default: Any) -> Any:
        self._read(key)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._read(key)
        return super().setdefault(key, default)

    def __copy__(self) -> RecordingDict:
        # The copy of the whole config (DeepSpeedConfig's own first step) is no read of its keys.
        if self._path and self._passes_on_copies:
            self.consume_all()
        copied = RecordingDict({}, self._path, self._log, self._passes_on_copies)
        dict.update(copied, self)
        return copied

    def keys_read_by_section(self) -> Dict[str, List[str]]:
        """{dotted section path ("" = top level): sorted keys looked up in it}, every section of the tree listed."""
        out: Dict[str, set] = {}

        def sections(node: dict, path: str) -> None:  # dict.items: walking the tree is no read
            out[path] = set()
            for key, value in dict.items(node):
                if isinstance(value, dict):
                    sections(value, f"{path}.{key}" if path else str(key))

        sections(self, self._path)
        for entry in self._log:
            parent, _, key = entry.rpartition(".")
            out.setdefault(parent, set()).add(key)
        return {path: sorted(keys) for path, keys in out.items()}

    def consume_all(self) -> None:
        for path in _all_paths(dict(dict.items(self)), self._path):
            self._log.add(path)


class _RecordingKeys(KeysView):
    def __contains__(self, key: Any) -> bool:
        return key in self._mapping  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:
        for key in dict.__iter__(self._mapping):  # type: ignore[attr-defined]
            self._mapping._read(key)  # type: ignore[attr-defined]
            yield key


def _all_paths(value: Any, path: str = "") -> List[str]:
    out: List[str] = []
    if isinstance(value, dict):
        for key, item in dict.items(value):
            sub = f"{path}.{key}" if path else str(key)
            out.append(sub)
            out += _all_paths(item, sub)
    return out


def ignored_keys(config: Dict[str, Any], read: set) -> List[str]:
    """Keys of ``config`` DeepSpeed never read. A nested dict none of whose keys was read although its own key was
    is taken whole (DeepSpeed hands it to a pydantic model, which refuses unknown keys itself, or passes it on
    as it is, like optimizer params); so are the settings of a section whose ``enabled`` is false."""
    out = []
    disabled = {p.rpartition(".")[0] for p in _all_paths(config)
                if p.endswith(".enabled") and p in read and _get_path(config, p) is False}
    for path in _all_paths(config):
        if path.rpartition(".")[0] in disabled:
            continue  # the settings of a section that is off are rightly unread
        parent = path.rpartition(".")[0]
        siblings = [p for p in _all_paths(config) if p.rpartition(".")[0] == parent]
        consumed_whole = parent and not any(p in read for p in siblings)
        ancestors_read = all(".".join(path.split(".")[:i]) in read for i in range(1, path.count(".") + 1))
        if path not in read and not (consumed_whole and ancestors_read):
            out.append(path)
    # report the outermost ignored key only
    return [p for p in out if not any(p.startswith(q + ".") for q in out)]


# HF Transformers' Trainer and Accelerate fill these "auto" values (transformers/integrations/deepspeed.py,
# accelerate's DeepSpeedPlugin); the values are those of a small run: micro batch 4, lr 1e-4, hidden size 64.
HIDDEN = 64
HF_FILLS = {
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "optimizer.params.lr": 1e-4, "optimizer.params.betas": [0.9, 0.999], "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0, "scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": 1e-4,
    "scheduler.params.warmup_num_steps": 10, "scheduler.params.total_num_steps": 100, "fp16.enabled": False,
    "bf16.enabled": False, "zero_optimization.reduce_bucket_size": HIDDEN * HIDDEN,
    "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * HIDDEN * HIDDEN),
    "zero_optimization.stage3_param_persistence_threshold": 10 * HIDDEN,
    "zero_optimization.stage": 2, "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    "zero_optimization.offload_optimizer.device": "none", "zero_optimization.offload_param.device": "none",
    "zero_optimization.offload_optimizer.nvme_path": "/local_nvme", "zero_optimization.offload_param.nvme_path":
    "/local_nvme",
}
HF_SPELLINGS = {"zero_optimization.prefetch_bucket_size": "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.param_persistence_threshold":
                    "zero_optimization.stage3_param_persistence_threshold",
                "zero_optimization.gather_16bit_weights_on_model_save":
                    "zero_optimization.stage3_gather_16bit_weights_on_model_save"}
# "auto" that DeepSpeed itself defines (its own default is the string "auto").
DEEPSPEED_AUTO = {"pipeline.stages", "data_types.keep_in_fp32_modules"}


def hf_fill(config: Dict[str, Any], world_size: int) -> Dict[str, Any]:
    """``config`` with every "auto" HF fills replaced as HF fills it (for ``world_size`` data-parallel ranks)."""
    out = copy.deepcopy(config)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{key}" if path else key
                if value == "auto":
                    name = HF_SPELLINGS.get(sub, sub)
                    if name == "train_batch_size":
                        node[key] = None  # filled below from the other two
                    elif name in HF_FILLS:
                        node[key] = copy.deepcopy(HF_FILLS[name])
                else:
                    walk(value, sub)

    given = {k: config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps")}
    walk(out, "")
    # HF refuses TrainingArguments that do not match the numbers the file gives: the one it fills is what they imply
    tb, mb = given["train_batch_size"], given["train_micro_batch_size_per_gpu"]
    if given["gradient_accumulation_steps"] == "auto" and isinstance(tb, int) and isinstance(mb, int):
        out["gradient_accumulation_steps"] = max(tb // (mb * world_size), 1)
    if "train_batch_size" in out and out["train_batch_size"] is None:
        mb = out.get("train_micro_batch_size_per_gpu") or HF_FILLS["train_micro_batch_size_per_gpu"]
        gas = out.get("gradient_accumulation_steps") or 1
        out["train_batch_size"] = mb * gas * world_size
    return out


def leftover_auto(config: Dict[str, Any]) -> List[str]:
    return [p for p in _all_paths(config) if _get_path(config, p) == "auto" and p not in DEEPSPEED_AUTO]


def _get_path(config: Dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def verdict(config: Dict[str, Any], world_size: int) -> Dict[str, Any]:
    """DeepSpeed's verdict on a user's config, "auto" filled as HF fills it: it is valid when DeepSpeed parses it,
    reads every key in it, and gets no "auto" that nobody fills."""
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    filled = hf_fill(config, world_size)
    recorded = RecordingDict(filled)
    model_init = DeepSpeedConfigModel.__init__
    dropped: set = set()  # keys a pydantic model of DeepSpeed got "auto" for: it drops them for its default

    def recording_init(self: Any, *args: Any, **data: Any) -> None:
        # DeepSpeed's pydantic models refuse unknown keys themselves (extra="forbid"): what reaches one is read
        for key, value in data.items():
            if isinstance(value, RecordingDict):
                value.consume_all()
            elif value == "auto":
                dropped.add(key)
        model_init(self, *args, **data)

    with mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0), \
            mock.patch.object(DeepSpeedConfigModel, "__init__", recording_init):
        try:
            parsed = ds_config.DeepSpeedConfig(recorded)
        except Exception as err:  # DeepSpeed raises many types
            return {"ok": False, "why": f"DeepSpeed refuses it: {type(err).__name__}: {str(err)[:300]}"}
    ignored = ignored_keys(filled, recorded._log)
    if ignored:
        return {"ok": False, "why": f"DeepSpeed ignores {ignored}"}
    left = [p for p in leftover_auto(filled) if p.rpartition(".")[2] not in dropped]
    if left:
        return {"ok": False, "why": f"'auto' nobody fills at {left}"}
    return {"ok": True, "why": "", "state": parsed_state(parsed)}


def answer(cases: List[Dict[str, Any]]) -> Dict[str, Any]:
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints while it parses; stdout carries the answer
        results = [(verdict if case.get("verdict") else parse)(case["config"], case["world_size"]) for case in cases]
    return {"version": installed_version(), "results": results}


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:  # one JSON list of cases a line, one JSON answer a line, until end of input
        for request in sys.stdin:
            sys.stdout.write(json.dumps(answer(json.loads(request))) + "\n")
            sys.stdout.flush()
    else:
        json.dump(answer(json.load(sys.stdin)), sys.stdout)
