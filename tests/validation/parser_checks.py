"""The checks DeepSpeed's config parser makes, found in DeepSpeed's own code (no list kept by hand).

``DeepSpeedConfig`` is run over probe configs that hold every section (each switched on) under a tracer that records
every function of DeepSpeed it enters (after a first, untraced pass, so that code DeepSpeed runs once at import is
not taken for parsing); the ``raise`` and ``assert`` statements of those functions, and of the helpers
they call that only raise, are the parser's checks. Pydantic validators are functions too: they are entered when a
section is parsed. Each check is named by its file, its function and the constant text of its message, so that a
check DeepSpeed adds, changes or drops in a release shows up as a new name.
"""

from __future__ import annotations

import ast
import copy
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")

# Every section DeepSpeed 0.19.8 parses, switched on where it has a switch, so that its parsing functions run.
PROBES: List[Dict[str, Any]] = [
    {"train_batch_size": 1},
    {"train_batch_size": 1, "aio": {}, "checkpoint": {"parallel_write": {}, "writer": {}}, "data_types": {},
     "flops_profiler": {"enabled": True}, "autotuning": {"enabled": True, "model_info": {}}, "timers": {},
     "expert_parallel": {"enabled": True}, "comms_logger": {"enabled": True}, "tensorboard": {"enabled": True},
     "wandb": {"enabled": True}, "csv_monitor": {"enabled": True}, "comet": {"enabled": True},
     "data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {},
                                                            "dynamic_batching": {}},
                         "data_routing": {"enabled": True, "random_ltd": {}}},
     "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"},
                           "zenflow": {}, "leaf_module": {}},
     "fp16": {"enabled": True}, "torch_autocast": {"enabled": False}, "compile": {"deepcompile": False},
     "tensor_parallel": {}, "hybrid_engine": {"enabled": True}, "pipeline": {}, "activation_checkpointing": {},
     "weight_quantization": {}, "datastates_ckpt": {}, "optimizer": {"type": "Adam", "params": {}},
     "scheduler": {"type": "WarmupLR", "params": {}}, "gradient_allreduce_op": "mean",
     "communication_data_type": "fp32"},
    {"train_batch_size": 1, "bf16": {"enabled": True}, "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
     "zero_optimization": {"stage": 2}},
]


@dataclass(frozen=True)
class Check:
    """One ``raise``/``assert`` of DeepSpeed's parser."""

    file: str  # relative to the deepspeed package
    function: str
    kind: str  # "raise" or "assert"
    text: str  # the constant text of its message ("" when it has none, e.g. a re-raise)
    line: int

    @property
    def name(self) -> str:
        return f"{self.file}:{self.function}:{self.text or self.kind}"


def deepspeed_root() -> str:
    import deepspeed

    return os.path.dirname(deepspeed.__file__)


def entered_functions(probes: List[Dict[str, Any]] = PROBES) -> Set[Tuple[str, int, str]]:
    """(file, first line, name) of every function of DeepSpeed that parsing the probes entered."""
    import deepspeed.runtime.config as ds_config

    root = deepspeed_root()
    entered: Set[Tuple[str, int, str]] = set()

    def tracer(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(root):
            entered.add((code.co_filename, code.co_firstlineno, code.co_name))

    with mock.patch.object(ds_config.dist, "get_world_size", return_value=1), \
            mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        for probe in probes:  # once untraced: what parsing imports lazily runs its import-time code now, not below
            try:
                ds_config.DeepSpeedConfig(copy.deepcopy(probe))
            except Exception:
                pass
        for probe in probes:
            sys.settrace(tracer)
            try:
                ds_config.DeepSpeedConfig(copy.deepcopy(probe))
            except Exception:  # a probe that trips a check has still entered the functions up to it
                pass
            finally:
                sys.settrace(None)
    return entered


def _message_text(node: Optional[ast.AST]) -> str:
    """The longest constant piece of a message expression (an f-string's literal parts, a format string's pieces)."""
    if node is None:
        return ""
    pieces: List[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            pieces += re.split(r"\{[^}]*\}", sub.value)
    pieces = [" ".join(p.split()) for p in pieces]
    return max(pieces, key=len, default="").strip(" .:,'\"")


def _message_of(node: ast.AST) -> Optional[ast.AST]:
    if isinstance(node, ast.Assert):
        return node.msg
    exc = node.exc if isinstance(node, ast.Raise) else None
    if isinstance(exc, ast.Call):
        return exc.args[0] if exc.args else None
    return exc if isinstance(exc, (ast.Constant, ast.JoinedStr)) else None


def _function_nodes(path: str) -> Dict[Tuple[int, str], ast.FunctionDef]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    out: Dict[Tuple[int, str], ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            out[(node.lineno, node.name)] = out[(first, node.name)] = node  # code objects start at the decorator
    return out


def _only_raises(node: ast.FunctionDef) -> bool:
    body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return bool(body) and isinstance(body[-1], ast.Raise)


def parser_checks() -> List[Check]:
    """Every check of the functions the parser enters, and of the raising helpers they call (``_raise_...``)."""
    import importlib

    root = deepspeed_root()
    functions: Dict[str, Dict[Tuple[int, str], ast.FunctionDef]] = {}
    scanned: List[Tuple[str, ast.FunctionDef]] = []
    for path, first, name in sorted(entered_functions()):
        nodes = functions.setdefault(path, _function_nodes(path))
        if (first, name) in nodes:
            scanned.append((path, nodes[(first, name)]))
    helpers = []
    for path, node in scanned:  # helpers that only raise, called by name from an entered function
        module_name = "deepspeed." + os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
        module = importlib.import_module(module_name)
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                target = getattr(module, call.func.id, None)
                code = getattr(target, "__code__", None)
                if code is None or not code.co_filename.startswith(root):
                    continue
                nodes = functions.setdefault(code.co_filename, _function_nodes(code.co_filename))
                helper = nodes.get((code.co_firstlineno, code.co_name))
                if helper is not None and _only_raises(helper):
                    helpers.append((code.co_filename, helper))
    checks = {}
    for path, node in scanned + helpers:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Raise, ast.Assert)):
                check = Check(os.path.relpath(path, root), node.name, "assert" if isinstance(sub, ast.Assert)
                              else "raise", _message_text(_message_of(sub)), sub.lineno)
                checks[(check.file, check.line)] = check
    return sorted(checks.values(), key=lambda c: (c.file, c.line))


def named(checks: List[Check]) -> Dict[str, Check]:
    """Checks by name; identical names (the same message twice in a function) get #2, #3 in source order."""
    out: Dict[str, Check] = {}
    for check in checks:
        name, n = check.name, 1
        while name in out:
            n += 1
            name = f"{check.name}#{n}"
        out[name] = check
    return out


if __name__ == "__main__":
    for name in named(parser_checks()):
        print(repr(name))
