"""Checkpointing sections: ``checkpoint``, NVMe ``aio``, ``data_types`` and DataStates ``datastates_ckpt``.

DeepSpeed reads all of them as plain dicts. ``checkpoint`` has two readers: the engine (tag validation,
universal/node-local loading, ``parallel_write``) and the checkpoint-engine factory (serialization, ``writer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from dsconf.schema._field import doc, section

# DeepSpeed upper-cases these before comparing; listed in lower case as dsconf's case-insensitive choices.
TAG_VALIDATION_MODES = ["warn", "ignore", "fail"]
WRITER_TYPES = ["mock", "python", "fast"]
DATA_PARALLEL_UNITS = ["replica", "socket", "machine"]
# Spellings DeepSpeed's DtypeEnum accepts for a floating-point dtype (case-sensitive).
DTYPES = ["fp32", "float32", "float", "torch.float32", "fp16", "float16", "half", "torch.float16",
          "bf16", "bfloat16", "torch.bfloat16"]


@dataclass
class ParallelWriteConfig:
    pipeline_stage: bool = doc(False, "Each pipeline stage writes its own part of the checkpoint")


@dataclass
class CheckpointWriterConfig:
    type: str = doc("FAST", "Checkpoint writer: mock, python or fast", choices=WRITER_TYPES, case_insensitive=True)
    decoupled: bool = doc(False, "Write checkpoints from a separate process, decoupled from training")
    io_buffer_size: int = doc(64 * 1024**2, "Bytes of the writer's I/O buffer")
    io_buffer_double: bool = doc(True, "Double-buffer checkpoint I/O")
    show_statistics: bool = doc(False, "Print checkpoint-writing statistics")
    data_parallel: Optional[str] = doc(None, "Data-parallel ranks sharing a write: replica, socket or machine",
                                       choices=DATA_PARALLEL_UNITS, case_insensitive=True)
    io_multiplier: int = doc(1, "Multiplier of the writer's I/O parallelism")


@dataclass
class CheckpointConfig:
    tag_validation: str = doc("WARN", "Check that all ranks save the same tag: Warn, Ignore or Fail",
                              choices=TAG_VALIDATION_MODES, case_insensitive=True)
    load_universal: bool = doc(False, "Load a universal (reshaped) checkpoint")
    use_node_local_storage: bool = doc(False, "Save on node-local storage (each node's rank 0 writes)")
    parallel_write: ParallelWriteConfig = doc(ParallelWriteConfig(), "Parallel checkpoint writing")
    checkpoint_serialization: bool = doc(True, "Serialize tensors with torch.save's zipfile format")
    writer: Any = section(CheckpointWriterConfig, "Fast checkpoint writer; null = torch.save")


@dataclass
class AioConfig:
    block_size: int = doc(1_048_576, "Bytes per asynchronous I/O request to NVMe")
    queue_depth: int = doc(8, "Outstanding asynchronous I/O requests")
    intra_op_parallelism: int = doc(1, "Threads serving each I/O operation")
    single_submit: bool = doc(False, "Submit requests one at a time instead of in batches")
    overlap_events: bool = doc(True, "Overlap request submission with completion polling")
    use_gds: bool = doc(False, "Use NVIDIA GPUDirect Storage (CUDA only)")


@dataclass
class DataTypesConfig:
    grad_accum_dtype: Optional[str] = doc(None, "Dtype of gradient accumulation; null = the model's dtype",
                                          choices=DTYPES)
    param_dtype: Optional[str] = doc(None, "Parameter dtype; must match fp16/bf16; null = the enabled precision",
                                     choices=DTYPES)
    buffer_dtype: Optional[str] = doc(None, "Dtype to cast module buffers to; null = keep the loaded dtype",
                                      choices=DTYPES)
    keep_in_fp32_modules: Any = doc("auto", "Buffers kept in fp32 under fp16/bf16: 'auto' (the model's) or patterns",
                                    type=Union[str, List[str]], since="0.19.8")


@dataclass
class CheckpointingSections:
    checkpoint: Any = section(CheckpointConfig, "Checkpoint saving and loading; null = DeepSpeed's defaults")
    aio: Any = section(AioConfig, "Asynchronous NVMe I/O for ZeRO-Infinity and swapping; null = DeepSpeed's defaults")
    data_types: Any = section(DataTypesConfig, "Dtypes of gradient accumulation, parameters and buffers")
    datastates_ckpt: Any = doc(None, "DataStates-LLM asynchronous checkpointing options; present = on, null = off",
                               type=Optional[Dict[str, Any]])
