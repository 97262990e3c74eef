"""Parallelism sections: AutoTP ``tensor_parallel``, ``pipeline``, AutoEP ``expert_parallel``, the RLHF
``hybrid_engine``, and the top-level ``sequence_parallel_size`` / ``data_parallel_size`` /
``use_data_before_expert_parallelism``.

``tensor_parallel`` and ``hybrid_engine`` are pydantic models in DeepSpeed; ``pipeline`` and ``expert_parallel``
are read as plain dicts (DeepSpeed fills in its defaults key by key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Union

from dsconf.schema._field import doc, section


@dataclass
class TPConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.tensor_parallel.config.TPConfig"

    tp_size: int = doc(1, "Devices the model is split across with tensor parallelism")
    tp_grain_size: int = doc(1, "Granularity of MLP/lm_head splits (not yet used in training)")


@dataclass
class TensorParallelConfig:
    """AutoTP training. ``dtype``, ``mpu``, ``tp_group`` and ``injection_policy_tuple`` of DeepSpeed's model hold
    Python objects (a torch.dtype, process groups, module classes) and cannot be given in a JSON config."""

    deepspeed_model: ClassVar[str] = "deepspeed.runtime.tensor_parallel.config.TPTrainingConfig"

    autotp_size: int = doc(0, "AutoTP tensor-parallel degree for training; 0 = off")
    tp_overlap_comm: bool = doc(False, "Overlap tensor-parallel all-reduce with computation")
    vocab_parallel_lm_head: Optional[bool] = doc(
        None, "Shard the vocabulary of lm_head; null = only for a supported HF tied-embedding plan", since="0.19.8")
    vocab_parallel_ce_backend: str = doc("torch", "Cross-entropy kernel of the vocab-parallel lm_head",
                                         choices=["torch", "liger"], since="0.19.8")
    tensor_parallel: TPConfig = doc(TPConfig(), "Tensor-parallel group settings", aliases=("tp",))
    partition_config: Optional[Dict[str, Any]] = doc(
        None, "Custom AutoTP layer partitioning: {use_default_specs, layer_specs: [...]}")
    preset_model: Optional[str] = doc(None, "Built-in AutoTP preset: llama, bloom, chatglm, mixtral, qwen2, ...")
    keep_module_on_host: bool = doc(False, "Keep loaded checkpoint weights on the host, not the device")
    replace_with_kernel_inject: bool = doc(False, "Inject DeepSpeed inference kernels", aliases=("kernel_inject",))


@dataclass
class PipelineConfig:
    stages: Any = doc("auto", "Pipeline stages (recorded; PipelineModule's num_stages decides)",
                      type=Union[str, int])
    partition: str = doc("best", "Layer partitioning (recorded; PipelineModule's partition_method decides)")
    seed_layers: bool = doc(False, "Seed each layer differently (recorded; PipelineModule's seed_layers decides)")
    activation_checkpoint_interval: int = doc(0, "Checkpoint activations every N layers; 0 = off")
    pipe_partitioned: bool = doc(True, "Partition activations sent between stages across model-parallel ranks")
    grad_partitioned: bool = doc(True, "Partition gradients sent between stages across model-parallel ranks")
    use_reentrant: Optional[bool] = doc(None, "Reentrant activation checkpointing; null = true")


@dataclass
class ExpertParallelConfig:
    """AutoEP: DeepSpeed replaces the MoE layers of a recognised model with expert-parallel ones."""

    enabled: bool = doc(False, "Replace MoE layers with AutoEP expert-parallel layers")
    autoep_size: int = doc(1, "Expert-parallel degree (ranks that share the experts)")
    expert_tensor_parallel_size: int = doc(1, "Tensor-parallel degree inside each expert")
    validate_folding_routing: bool = doc(False, "Check the routing of folded parallel groups")
    async_split_plan: bool = doc(False, "Plan token splits asynchronously", since="0.19.8")
    preset_model: Optional[str] = doc(None, "AutoEP model preset; null = detect from the model")
    moe_layer_pattern: Optional[str] = doc(None, "Regex of MoE layer module names (custom preset)")
    expert_pattern: Optional[str] = doc(None, "Attribute of the MoE layer holding the experts")
    router_pattern: Optional[str] = doc(None, "Attribute of the MoE layer holding the router")
    use_grouped_mm: bool = doc(True, "Run experts with grouped matmul (else a sequential loop)")
    disable_triton_grouped_mm: bool = doc(False, "Do not use the Triton grouped-matmul kernel")
    route_norm: Optional[bool] = doc(None, "Renormalise the top-k routing weights; null = the preset's")
    route_scale: float = doc(1.0, "Scale applied to routing weights")
    score_apply: str = doc("auto", "Apply routing scores before or after the experts",
                           choices=["auto", "pre", "post"])
    combine_impl: str = doc("auto", "How expert outputs are combined (fused_weighted_sum needs 0.19.8)",
                            choices=["auto", "weighted_sum", "fused_weighted_sum", "legacy_bmm"])
    row_weighting_impl: str = doc("auto", "Row weighting kernel (fused needs comm_backend=deepep)",
                                  choices=["auto", "eager", "fused"], since="0.19.8")
    gate_up_impl: str = doc("separate", "Gate and up projections as separate or one fused grouped matmul",
                            choices=["separate", "fused"], since="0.19.8")
    comm_backend: str = doc("comm", "All-to-all backend", choices=["comm", "deepep"], since="0.19.8")
    comm_num_sm: int = doc(12, "GPU SMs the DeepEP collective may use", ge=1, since="0.19.8")
    comm_qp_margin: int = doc(4, "Extra DeepEP queue pairs", ge=0, since="0.19.8")
    comm_max_tokens_per_rank: int = doc(0, "Most tokens one rank routes (needed > 0 with deepep)", ge=0,
                                        since="0.19.8")
    num_expert_groups: Optional[int] = doc(None, "Expert groups for group-limited routing", ge=1)
    num_limited_groups: Optional[int] = doc(None, "Groups each token may route to (<= num_expert_groups)", ge=1)
    score_func: str = doc("auto", "Router score function", choices=["auto", "softmax", "sigmoid"])
    top_k: Any = doc("auto", "Experts per token: a number, or 'auto' for the model config's", type=Union[int, str])
    load_balance_coeff: Optional[float] = doc(None, "Auxiliary-loss-free balancing: unsupported, must stay null")
    routed_scaling_factor: Any = doc("auto", "Scale of routed expert outputs: a number or 'auto'",
                                     type=Union[float, str])
    expert_w1: Optional[str] = doc(None, "Name of the experts' first (gate) weight; null = the preset's")
    expert_w2: Optional[str] = doc(None, "Name of the experts' down-projection weight; null = the preset's")
    expert_w3: Optional[str] = doc(None, "Name of the experts' up-projection weight; null = the preset's")
    num_experts_attr: Optional[str] = doc(None, "model.config attribute with the number of experts")
    top_k_attr: Optional[str] = doc(None, "model.config attribute with the experts per token")
    has_shared_experts: Optional[bool] = doc(None, "The MoE layer also has shared experts; null = the preset's")
    shared_experts_pattern: Optional[str] = doc(None, "Attribute of the MoE layer holding the shared experts")
    shared_experts_gate_pattern: Optional[str] = doc(None, "Attribute of the MoE layer holding the shared gate")
    expert_activation: Optional[str] = doc(None, "Registered expert activation; null = the preset's",
                                           since="0.19.8")


@dataclass
class HybridEngineConfig:
    deepspeed_model: ClassVar[str] = "deepspeed.runtime.config.HybridEngineConfig"

    enabled: bool = doc(False, "Switch between training and inference kernels (DeepSpeed-Chat RLHF)")
    max_out_tokens: int = doc(512, "Longest generation the inference cache holds", gt=0)
    inference_tp_size: int = doc(1, "Tensor-parallel degree during generation")
    release_inference_cache: bool = doc(False, "Free the inference cache after each generation")
    pin_parameters: bool = doc(True, "Pin gathered parameters in memory during generation")
    tp_gather_partition_size: int = doc(8, "Layers gathered at a time for tensor-parallel generation")
    enable_cuda_graph: bool = doc(False, "Capture generation in CUDA graphs", since="0.19.8")


@dataclass
class ParallelismSections:
    tensor_parallel: Any = section(TensorParallelConfig, "AutoTP tensor parallelism for training; null = off")
    pipeline: Any = section(PipelineConfig, "Pipeline engine settings; null = DeepSpeed's defaults")
    expert_parallel: Any = section(ExpertParallelConfig, "AutoEP expert parallelism for MoE models; null = off")
    hybrid_engine: Any = section(HybridEngineConfig, "DeepSpeed-Chat hybrid engine; null = off")
    sequence_parallel_size: Optional[int] = doc(
        None, "Ulysses sequence-parallel degree; DeepSpeed divides the world size by it; null = not written", ge=1)
    # read by deepspeed.initialize, not by DeepSpeedConfig: with sequence_parallel_size it shapes the device mesh
    data_parallel_size: Optional[int] = doc(
        None, "Data-parallel degree of deepspeed.initialize's (data, sequence) mesh; needs sequence_parallel_size",
        ge=1)
    use_data_before_expert_parallelism: bool = doc(False, "Lay out data-parallel ranks before expert-parallel ones")
