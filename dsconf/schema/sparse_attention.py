"""The ``sparse_attention`` section, one model per mode with exactly the keys DeepSpeed reads for it.

DeepSpeed 0.19.8 removed sparse attention; the target version decides whether this section is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from dsconf.schema._field import doc

ATTENTION_TYPES = ["bidirectional", "unidirectional"]


@dataclass
class DenseSparsityConfig:
    mode: str = doc("dense", "Sparsity structure", choices=["dense"])
    block: int = doc(16, "Block size of the blocked sparse matrices", ge=1)


@dataclass
class _LayoutConfig(DenseSparsityConfig):
    """Keys every non-dense mode shares (DeepSpeed's SparsityConfig base)."""

    different_layout_per_head: bool = doc(False, "Give each head its own layout")


@dataclass
class FixedSparsityConfig(_LayoutConfig):
    mode: str = doc("fixed", "Sparsity structure", choices=["fixed"])
    num_local_blocks: int = doc(4, "Blocks in each local attention window", ge=1)
    num_global_blocks: int = doc(1, "Blocks of a local window that act as global representatives", ge=1)
    attention: str = doc("bidirectional", "Attention direction", choices=ATTENTION_TYPES)
    horizontal_global_attention: bool = doc(False, "Global blocks also attend to all blocks (bidirectional only)")
    num_different_global_patterns: int = doc(1, "Distinct global attention layouts across heads", ge=1)


@dataclass
class VariableSparsityConfig(_LayoutConfig):
    mode: str = doc("variable", "Sparsity structure", choices=["variable"])
    num_random_blocks: int = doc(0, "Random blocks in each block row", ge=0)
    local_window_blocks: List[int] = doc([4], "Blocks in each local window; the last repeats")
    global_block_indices: List[int] = doc([0], "Blocks used as global attention")
    global_block_end_indices: Optional[List[int]] = doc(None, "Exclusive ends of global windows (same length)")
    attention: str = doc("bidirectional", "Attention direction", choices=ATTENTION_TYPES)
    horizontal_global_attention: bool = doc(False, "Global blocks also attend to all blocks (bidirectional only)")


@dataclass
class BigBirdSparsityConfig(_LayoutConfig):
    mode: str = doc("bigbird", "Sparsity structure", choices=["bigbird"])
    num_random_blocks: int = doc(0, "Random blocks in each block row", ge=0)
    num_sliding_window_blocks: int = doc(3, "Blocks in the sliding local window", ge=1)
    num_global_blocks: int = doc(1, "Global blocks", ge=1)


@dataclass
class BSLongformerSparsityConfig(_LayoutConfig):
    mode: str = doc("bslongformer", "Sparsity structure", choices=["bslongformer"])
    num_sliding_window_blocks: int = doc(3, "Blocks in the sliding local window", ge=1)
    global_block_indices: List[int] = doc([0], "Blocks used as global attention")
    global_block_end_indices: Optional[List[int]] = doc(None, "Exclusive ends of global windows (same length)")


SPARSITY_MODES: Dict[str, type] = {
    "dense": DenseSparsityConfig,
    "fixed": FixedSparsityConfig,
    "variable": VariableSparsityConfig,
    "bigbird": BigBirdSparsityConfig,
    "bslongformer": BSLongformerSparsityConfig,
}
