"""HF Transformers' ``Trainer`` in a rank of a dsconf job: ``TrainingArguments`` that go with the job's DeepSpeed dict.

The "auto" values HF would fill are already filled, and every mismatch refused, at compose time
(``dsconf.hf_auto``, run by export when ``hf`` is set), so ``ds_config.json`` holds what the engine runs. In a
rank, ``training_arguments(cfg)`` builds ``TrainingArguments(**cfg.training_args, deepspeed=<job's dict>)``.
"""

from __future__ import annotations

from typing import Any

from dsconf.errors import join_path
from dsconf.hf_auto import hf_settings, training_args_values, training_arguments_class
from dsconf.integrations import check_world
from dsconf.launch import context


def training_arguments(cfg: Any, **overrides: Any) -> Any:
    """``TrainingArguments`` for this rank: the fields at ``hf.training_args``, ``overrides``, and the job's
    DeepSpeed dict (``ds_config.json``) as ``deepspeed``."""
    TrainingArguments = training_arguments_class()
    args_path = str(hf_settings(cfg).training_args) if cfg.get("hf") is not None else "training_args"
    values = {**training_args_values(cfg, args_path), **overrides}
    args = TrainingArguments(**values, deepspeed=context.deepspeed_config())
    check_world(args.world_size, "TrainingArguments", f"{join_path(args_path, 'use_cpu')}=true")
    return args
