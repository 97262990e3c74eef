"""What HF Transformers' Trainer (and Accelerate, for it) fills each "auto" DeepSpeed key from: said once, here.

Two readers take it from this table. The schema's fields that accept "auto" name their entry
(``hf_auto(..., "optimizer.params.lr", ...)``), and their ``auto`` note, which ``describe``, ``explain`` and
``normalize``'s messages show, is the entry's text. ``dsconf.hf_auto``, which fills the values at compose time as
HF would, takes from it the TrainingArguments fields each value comes from (named in its mismatch messages), the
calculation it words, the keys filled from the model's hidden size, and the Accelerate plugin fields (and so their
``ACCELERATE_DEEPSPEED_*`` variables); only how HF computes each value is code there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class FilledFrom:
    """Where an "auto" value comes from."""

    args: Tuple[str, ...] = ()  # the TrainingArguments fields it is taken from
    either: bool = False  # true when any one of ``args`` makes it (fp16 or fp16_full_eval), not all of them
    formula: str = ""  # how the value is calculated, when it is not simply the value of ``args``
    model: bool = False  # calculated from the model config's hidden size (``hf.model_config``)
    plugin: str = ""  # a field of Accelerate's DeepSpeedPlugin instead (``accelerate config``, or its variable)
    note: str = ""  # a remark for the reader

    @property
    def accelerate_env(self) -> str:
        """The variable ``accelerate launch`` sets for ``plugin``, which the plugin reads."""
        return f"ACCELERATE_DEEPSPEED_{self.plugin.upper()}"

    def __str__(self) -> str:
        if self.plugin:
            text = f"Accelerate: {self.plugin}"
        elif self.model:
            text = f"the model config: {self.formula}"
        elif self.formula:
            text = f"TrainingArguments: {self.formula}" if self.args else self.formula
        else:
            text = "TrainingArguments." + (" / " if self.either else ", ").join(self.args)
        return f"{text}, {self.note}" if self.note else text


# DeepSpeed key -> its source, in the order HF fills them: HfTrainerDeepSpeedConfig.trainer_config_process,
# trainer_config_finalize, then Accelerate's DeepSpeedPlugin fields.
HF_SOURCES: Dict[str, FilledFrom] = {
    "train_micro_batch_size_per_gpu": FilledFrom(("per_device_train_batch_size",)),
    "gradient_accumulation_steps": FilledFrom(("gradient_accumulation_steps",)),
    "train_batch_size": FilledFrom(("per_device_train_batch_size", "gradient_accumulation_steps"),
                                   formula="world size x per_device_train_batch_size x gradient_accumulation_steps"),
    "gradient_clipping": FilledFrom(("max_grad_norm",)),
    "optimizer.params.lr": FilledFrom(("learning_rate",)),
    "optimizer.params.betas": FilledFrom(("adam_beta1", "adam_beta2")),
    "optimizer.params.eps": FilledFrom(("adam_epsilon",)),
    "optimizer.params.weight_decay": FilledFrom(("weight_decay",)),
    "scheduler.params.warmup_min_lr": FilledFrom(formula="0 (HF Trainer)"),
    "scheduler.params.warmup_max_lr": FilledFrom(("learning_rate",)),
    "fp16.enabled": FilledFrom(("fp16", "fp16_full_eval"), either=True),
    "bf16.enabled": FilledFrom(("bf16", "bf16_full_eval"), either=True),
    # Apex AMP: filled by HF versions that still had fp16_backend (the installed ones do not fill it)
    "amp.enabled": FilledFrom(("fp16",), note="with fp16_backend=apex"),
    "amp.opt_level": FilledFrom(("fp16_opt_level",)),
    "scheduler.params.total_num_steps": FilledFrom(formula="the Trainer's number of training steps"),
    "scheduler.params.warmup_num_steps": FilledFrom(("warmup_steps",), note="or warmup_ratio x total steps"),
    "zero_optimization.reduce_bucket_size": FilledFrom(formula="hidden_size**2", model=True),
    "zero_optimization.stage3_prefetch_bucket_size": FilledFrom(formula="0.9 * hidden_size**2", model=True),
    "zero_optimization.stage3_param_persistence_threshold": FilledFrom(formula="10 * hidden_size", model=True),
    "zero_optimization.stage": FilledFrom(plugin="zero_stage"),
    "zero_optimization.offload_optimizer.device": FilledFrom(plugin="offload_optimizer_device"),
    "zero_optimization.offload_param.device": FilledFrom(plugin="offload_param_device"),
    "zero_optimization.offload_param.nvme_path": FilledFrom(plugin="offload_param_nvme_path"),
    "zero_optimization.offload_optimizer.nvme_path": FilledFrom(plugin="offload_optimizer_nvme_path"),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": FilledFrom(plugin="zero3_save_16bit_model"),
}
