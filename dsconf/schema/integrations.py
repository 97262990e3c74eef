"""dsconf's keys for the tools that take a DeepSpeed dict themselves (HF Transformers' Trainer).

Not DeepSpeed sections: they tell dsconf where, in the user's own config, the tool's arguments are, so that
HF's "auto" values are filled at compose time exactly as the tool would fill them (``dsconf.hf_auto``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dsconf.schema._field import doc


@dataclass
class HfConfig:
    training_args: str = doc("training_args", "Dotted path of the node holding TrainingArguments' fields")
    model_config: Optional[str] = doc(None, "Dotted path of the node with the model's hidden_size, for the ZeRO "
                                            "bucket 'auto' keys")
    train_examples: Optional[int] = doc(None, "Training examples: give the total steps when max_steps is not set",
                                        gt=0)
