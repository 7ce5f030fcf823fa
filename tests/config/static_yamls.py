"""Static-graph (GRAPH_MODE) training YAMLs shaped like MindSpore Transformers 2.1.0's own pretrain configs.

Written from the structure and values documented in mindformers-2.1.md §6.3 and §7 (the per-file
columns DS3 / Q3 / Q3M of its tables) plus the published model sizes; data paths are placeholders.
"""
from __future__ import annotations

from pathlib import Path

_COMMON_CONTEXT_Q3 = """\
context:
  mode: 0
  device_target: "Ascend"
  max_device_memory: "58GB"
  max_call_depth: 10000
  memory_optimize_level: "O0"
  save_graphs: False
  save_graphs_path: "./graph"
  device_id: 0
  jit_config:
    jit_level: "O1"
  ascend_config:
    precision_mode: "must_keep_origin_dtype"
    parallel_speed_up_json_path: "./parallel_speed_up.json"
"""

# configs/deepseek3/pretrain_deepseek3_671b.yaml
DEEPSEEK3_671B = """\
seed: 42
output_dir: './output'
load_checkpoint: ''
load_ckpt_format: 'safetensors'
src_strategy_path_or_dir: ''
auto_trans_ckpt: False
only_save_strategy: False
resume_training: False
use_parallel: True
run_mode: 'train'
train_precision_sync: False
use_legacy: False

trainer:
  type: CausalLanguageModelingTrainer
  model_name: 'deepseekV3'

runner_config:
  epochs: 1
  batch_size: 1
  sink_mode: True
  sink_size: 1

runner_wrapper:
  type: MFTrainOneStepCell
  scale_sense: 1.0
  use_clip_grad: True

optimizer:
  type: AdamW
  betas: [0.9, 0.95]
  eps: 1.e-8
  weight_decay: 0.01
  swap: True

lr_schedule:
  type: ConstantWarmUpLR
  learning_rate: 2.e-5
  lr_end: 2.e-5
  warmup_lr_init: 0.0
  warmup_steps: 200
  total_steps: -1

train_dataset: &train_dataset
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: "GPTDataset"
    sizes:
      - 128000
      - 0
      - 0
    shuffle: False
    config:
      seed: 1234
      split: "1, 0, 0"
      seq_length: 4096
      eod_mask_loss: False
      reset_position_ids: False
      create_attention_mask: True
      reset_attention_mask: False
      create_compressed_eod_mask: False
      eod_pad_length: 128
      eod: 1
      pad: -1
      data_path:
        - '1'
        - "/path/to/wiki103-megatron_text_document"
      num_dataset_builder_threads: 1
  num_parallel_workers: 8
  python_multiprocessing: False
  drop_remainder: True
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset

context:
  mode: 0
  device_target: "Ascend"
  max_device_memory: "56GB"
  max_call_depth: 10000
  memory_optimize_level: "O0"
  mempool_block_size: "1GB"
  save_graphs: False
  jit_config:
    jit_level: "O1"
  ascend_config:
    precision_mode: "must_keep_origin_dtype"

parallel_config:
  data_parallel: &dp 4
  model_parallel: 8
  pipeline_stage: 8
  micro_batch_num: &micro_batch_num 32
  expert_parallel: 32
  use_seq_parallel: True
  gradient_aggregation_group: 4
micro_batch_interleave_num: 1

parallel:
  parallel_mode: 1
  gradients_mean: False
  enable_alltoall: True
  full_batch: False
  dataset_strategy: [[*dp, 1], [*dp, 1], [*dp, 1], [*dp, 1]]
  search_mode: "sharding_propagation"
  enable_parallel_optimizer: True
  strategy_ckpt_config:
    save_file: "./ckpt_strategy.ckpt"
    only_trainable_params: False
  parallel_optimizer_config:
    gradient_accumulation_shard: False
    parallel_optimizer_threshold: 64
    optimizer_weight_shard_size: 256
  pipeline_config:
    pipeline_interleave: True
    pipeline_scheduler: 'seqpipe'

recompute_config:
  recompute: True
  select_recompute: False
  mp_comm_recompute: True

model:
  model_config:
    model_type: deepseek_v3
    architectures: [DeepseekV3ForCausalLM]
    offset: [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, -2]]
    pp_interleave_num: 2
    seq_length: 4096
    vocab_size: 129280
    hidden_size: 7168
    intermediate_size: 18432
    num_hidden_layers: 61
    max_position_embeddings: 4096
    hidden_act: 'silu'
    num_attention_heads: 128
    num_key_value_heads: 128
    rms_norm_eps: 1.e-6
    add_bias_linear: False
    use_flash_attention: True
    use_attn_mask_compression: True
    initializer_range: 0.006
    position_embedding_type: "yarn"
    rope_theta: 10000.0
    rotary_scaling_factor: 40.0
    beta_fast: 32.0
    beta_slow: 1.0
    mscale: 1.0
    mscale_all_dim: 1.0
    params_dtype: "float32"
    compute_dtype: "bfloat16"
    layernorm_compute_dtype: "float32"
    softmax_compute_dtype: "float32"
    rotary_dtype: "float32"
    router_dense_type: "float32"
    multi_latent_attention: True
    mla_qkv_concat: False
    qk_layernorm: True
    q_lora_rank: 1536
    kv_lora_rank: 512
    qk_nope_head_dim: 128
    qk_rope_head_dim: 64
    v_head_dim: 128
    apply_rope_fusion: False
    bias_swiglu_fusion: True
    num_nextn_predict_layers: 1
    mtp_loss_factor: 0.3
    gated_linear_unit: True
    moe_grouped_gemm: True
    moe_intermediate_size: 2048
    n_shared_experts: 1
    n_routed_experts: 256
    num_experts_per_tok: 8
    first_k_dense_replace: 3
    routed_scaling_factor: 2.5
    n_group: 8
    topk_group: 4
    moe_router_load_balancing_type: "seq_aux_loss"
    moe_aux_loss_coeff: 0.0001
    moe_token_drop_policy: probs
    moe_router_enable_expert_bias: True
    moe_router_bias_update_rate: 0.001
    moe_token_dispatcher_type: "alltoall"
    use_pad_tokens: True
    use_fused_ops_topkrouter: True
    hidden_dropout: 0.0
    attention_dropout: 0.0
    tie_word_embeddings: False
    bos_token_id: 0
    eos_token_id: 1

callbacks:
  - type: MFLossMonitor
  - type: TopkBiasBalanceCallback
  - type: CheckpointMonitor
    prefix: "deepseekv3"
    save_checkpoint_steps: 1000
    keep_checkpoint_max: 5
    integrated_save: False
    async_save: False
    checkpoint_format: "safetensors"

profile: False
profile_start_step: 10
profile_stop_step: 11
init_start_profile: True
profile_communication: False
profile_memory: False
"""

# Blocks the two Qwen3 configs share ({...} fields differ per file).
_QWEN_HEAD = """\
seed: {seed}
output_dir: './output'
load_checkpoint: ''
load_ckpt_format: 'safetensors'
{strategy}auto_trans_ckpt: False
only_save_strategy: False
resume_training: False
use_parallel: True
run_mode: 'train'
use_legacy: False
{extra_top}
trainer:
  type: CausalLanguageModelingTrainer
  model_name: '{model_name}'

runner_config:
  epochs: {epochs}
  batch_size: 1
  gradient_accumulation_steps: 1
{sink}
runner_wrapper:
  type: MFTrainOneStepCell
  scale_sense: 1.0
  use_clip_grad: True

optimizer:
  type: AdamW
  betas: [0.9, 0.95]
  eps: 1.e-8
  weight_decay: 0.0

lr_schedule:
  type: ConstantWarmUpLR
  learning_rate: {lr}
  {warmup}
  total_steps: -1

train_dataset: &train_dataset
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: "GPTDataset"
    sizes:
      - 8000
      - 0
      - 0
    config:
      seed: 1234
      split: "1, 0, 0"
      seq_length: 4096
      eod_mask_loss: False
      reset_position_ids: False
      create_attention_mask: {attention_mask}
      reset_attention_mask: False
      create_compressed_eod_mask: False
      eod_pad_length: 128
      eod: 151643
      pad: 151643
      data_path:
        - '1'
        - "/path/to/wiki103-megatron_text_document"
  input_columns: ["input_ids", "labels", "loss_mask", "position_ids"]
  construct_args_key: ["input_ids", "labels", "loss_mask", "position_ids"]
  num_parallel_workers: 8
  python_multiprocessing: False
  drop_remainder: True
  numa_enable: False
  prefetch_size: 1
  seed: 1234
train_dataset_task:
  type: CausalLanguageModelDataset
  dataset_config: *train_dataset

""" + _COMMON_CONTEXT_Q3

_QWEN_PARALLEL = """
parallel_config:
  data_parallel: &dp 1
  model_parallel: 4
  pipeline_stage: 4
{parallel_config}  gradient_aggregation_group: 1
{vocab_emb_dp}micro_batch_interleave_num: 1

parallel:
  parallel_mode: 1
  gradients_mean: False
  enable_alltoall: {alltoall}
  full_batch: True
  search_mode: "sharding_propagation"
  enable_parallel_optimizer: False
  strategy_ckpt_config:
    save_file: "./ckpt_strategy.ckpt"
    only_trainable_params: False
{optimizer_config}
recompute_config:
  recompute: True
  select_recompute: False
  mp_comm_recompute: True
  parallel_optimizer_comm_recompute: True
"""

_QWEN_TAIL = """
callbacks:
  - type: MFLossMonitor
  - type: CheckpointMonitor
    prefix: "{prefix}"
    save_checkpoint_steps: 5000
    keep_checkpoint_max: 1
    integrated_save: False
    async_save: False
    checkpoint_format: "safetensors"

profile: False
profile_start_step: 1
profile_stop_step: 10
init_start_profile: False
profile_communication: False
profile_memory: True
{extra_tail}"""

# configs/qwen3/pretrain_qwen3_32b_4k.yaml
QWEN3_32B = _QWEN_HEAD.format(
    seed=42, strategy="src_strategy_path_or_dir: ''\n", extra_top="", model_name="Qwen3", epochs=2, sink="",
    lr="1.e-6", warmup="warmup_ratio: 0", attention_mask="True") + _QWEN_PARALLEL.format(
    parallel_config="  micro_batch_num: &micro_batch_num 4\n  use_seq_parallel: False\n",
    vocab_emb_dp="  vocab_emb_dp: False\n", alltoall="False",
    optimizer_config="  parallel_optimizer_config:\n    gradient_accumulation_shard: False\n"
                     "    parallel_optimizer_threshold: 64\n") + """
model:
  model_config:
    model_type: qwen3
    architectures: [Qwen3ForCausalLM]
    offset: [-1, -1, 1, 1]
    seq_length: 4096
    vocab_size: 151936
    hidden_size: 5120
    intermediate_size: 25600
    num_hidden_layers: 64
    num_attention_heads: 64
    num_key_value_heads: 8
    head_dim: 128
    max_position_embeddings: 40960
    rms_norm_eps: 1.e-6
    rope_theta: 1000000.0
    position_embedding_type: "rope"
    hidden_act: 'silu'
    gated_linear_unit: True
    add_bias_linear: False
    tie_word_embeddings: False
    qkv_concat: True
    use_contiguous_weight_layout_attention: False
    input_sliced_sig: True
    untie_embeddings_and_output_weights: True
    fp32_residual_connection: False
    use_flash_attention: True
    params_dtype: "float32"
    compute_dtype: "bfloat16"
    layernorm_compute_dtype: "float32"
    softmax_compute_dtype: "float32"
    rotary_dtype: "float32"
    hidden_dropout: 0.0
    attention_dropout: 0.0
    initializer_range: 0.02
    pad_token_id: 151643
    bos_token_id: 151643
    eos_token_id: 151645
""" + _QWEN_TAIL.format(prefix="qwen3", extra_tail="layer_scale: False\nlayer_decay: 0.65\nlr_scale_factor: 256\n")

# configs/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml
QWEN3_MOE_30B_A3B = _QWEN_HEAD.format(
    seed=1234, strategy="", extra_top="print_separate_loss: True\n", model_name="qwen3_moe", epochs=1,
    sink="  sink_mode: True\n  sink_size: 1\n", lr="1.e-5", warmup="warmup_steps: 0",
    attention_mask="False") + _QWEN_PARALLEL.format(
    parallel_config="  expert_parallel: 4\n  micro_batch_num: &micro_batch_num 16\n  use_seq_parallel: True\n",
    vocab_emb_dp="", alltoall="True", optimizer_config="") + """
model:
  model_config:
    model_type: qwen3_moe
    architectures: Qwen3MoeForCausalLM
    offset: 0
    vocab_size: 151936
    hidden_size: 2048
    intermediate_size: 6144
    num_hidden_layers: 48
    num_attention_heads: 32
    num_key_value_heads: 4
    head_dim: 128
    max_position_embeddings: 40960
    rms_norm_eps: 1.e-6
    rope_theta: 1000000.0
    position_embedding_type: "rope"
    hidden_act: 'silu'
    gated_linear_unit: True
    num_experts: 128
    num_experts_per_tok: 8
    moe_intermediate_size: 768
    router_dense_type: "float32"
    norm_topk_prob: False
    moe_router_pre_softmax: True
    routed_scaling_factor: 1.5
    moe_aux_loss_coeff: 0.001
    moe_router_load_balancing_type: "gbs_aux_loss"
    router_aux_loss_coef: 0.001
    moe_token_drop_policy: probs
    moe_grouped_gemm: True
    params_dtype: "float32"
    compute_dtype: "bfloat16"
    layernorm_compute_dtype: "float32"
    softmax_compute_dtype: "float32"
    rotary_dtype: "float32"
    add_bias_linear: False
    tie_word_embeddings: False
    use_flash_attention: True
    use_contiguous_weight_layout_attention: False
    input_sliced_sig: True
    hidden_dropout: 0.0
    attention_dropout: 0.0
""" + _QWEN_TAIL.format(prefix="qwen3_moe", extra_tail="")

STATIC = {"deepseek3_671b": DEEPSEEK3_671B, "qwen3_32b": QWEN3_32B, "qwen3_moe_30b_a3b": QWEN3_MOE_30B_A3B}


def write_static(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"pretrain_{name}.yaml"
    p.write_text(STATIC[name], encoding="utf-8")
    return p
