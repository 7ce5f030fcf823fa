"""One attrs class per top-level YAML section of a MindSpore Transformers PyNative config.

Field names are spelled exactly as the YAML keys, so a cattrs error path is what the user
typed and one YAML works in both tools. Every default is written here and nowhere else;
help text lives in field metadata (used by `--print-resolved` and the generated
docs/config-reference.md). Value and cross-field rules live in `rules.py`, not in validators, so that every
problem is reported at once with its path.
"""
from typing import Any, Optional, Union

import attrs

# Sections that accept keys we do not declare (the reference passes them on as kwargs).
# Unknown keys there are warnings; in every other section they are errors.
ALLOW_EXTRA = "allow_extra"


def field(default: Any = attrs.NOTHING, help: str = "", *, factory: Any = None, **meta: Any) -> Any:
    """An attrs field whose help text is kept in metadata (one place for defaults and docs)."""
    metadata = {"help": help, **meta}
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


def section(cls=None, *, allow_extra: bool = False):
    """Declare a config section: frozen, keyword-only, and marked strict or extra-tolerant."""

    def wrap(c):
        c = attrs.frozen(kw_only=True)(c)
        setattr(c, "__mftk_allow_extra__", allow_extra)
        return c

    return wrap(cls) if cls is not None else wrap


@section
class CheckpointConfig:
    enable_save: bool = field(True, "Save checkpoints during training (needs save_path).")
    save_path: str = field("", "Root directory of the checkpoint tree (iteration_XXXXXXXX/ dirs).", path=True)
    save_max: int = field(5, "Keep at most this many of the iteration dirs this run saved; older ones are removed.")
    save_interleaved_steps: int = field(1000, "Save every N steps counted from the start (or resume) step, and at the end.")
    no_save_optim: bool = field(False, "Do not write the optimizer (*-opt-*) files.")
    async_save: bool = field(False, "Write checkpoints from a background thread.")
    prefix: Optional[str] = field("checkpoint", "File name prefix of the safetensors files (null: none).")
    remove_redundancy: bool = field(False, "Balanced, de-duplicated save across replicas.")
    load_path: str = field("", "Checkpoint to load: save root (latest via tracker), iteration dir, or HF dir.", path=True)
    load_balanced: bool = field(False, "Read each shard once and broadcast it to its replicas.")
    no_load_optim: bool = field(False, "Load weights only (fresh optimizer, step 0).")
    load_worker_number: int = field(1, "Accepted for compatibility; has no effect.")
    save_global_layout_cache: bool = field(True, "Cache sharded-tensor metadata across saves (multi-process).")
    reshard_worker_num: int = field(1, "Workers used when loading an HF checkpoint.")
    save_trainable_only: bool = field(False, "LoRA: save the adapter weights only, plus the manifest "
                                      "mindformers_adapter_config.json (needs base_load_path).")
    base_load_path: str = field("", "LoRA: the frozen base (an HF dir or a checkpoint), loaded when load_path is "
                                "empty or an adapter-only checkpoint.", path=True)


@section
class TrainingConfig:
    steps: int = field(1000, "Absolute target global step (also the LR schedule's total_steps).")
    local_batch_size: int = field(1, "Samples per micro-batch per data-parallel rank.")
    global_batch_size: int = field(1, "Samples per optimizer step over all DP ranks and micro-batches.")
    max_norm: float = field(1.0, "Global gradient-norm clip threshold; <= 0 disables clipping (mftk).")
    seed: int = field(42, "Seed for parameter init and every RNG the trainer uses.")
    deterministic: bool = field(False, "Ask MindSpore for deterministic kernels.")
    rampup_batch_size: Optional[list[int]] = field(
        None, "Dynamic batch: [start_gbs, increment, rampup_samples].")
    use_skip_step_on_nan: bool = field(False, "Skip the update of a step whose loss or grad norm is not finite "
                                       "(false: mftk stops at the first one).")
    max_consecutive_skipped_steps: int = field(0, "With skipping on: stop when this many steps in a row were "
                                               "skipped (N=1: at the first); 0: no limit.")


@section
class ParallelismConfig:
    data_parallel_shard: int = field(-1, "FSDP shard degree; -1 shards over all of DP.")
    data_parallel_shard_strategy: str = field("optim_grads_params", "Accepted for compatibility; unused.")
    reshard_after_forward_policy: str = field("default", "FSDP: always / never / default (reshard unless PP).")
    cpu_offload: bool = field(False, "FSDP CPU offload.")
    disable_gradient_division: bool = field(True, "FSDP sums gradients; the loss scale averages them.")
    dense_fsdp_shard_size: Optional[int] = field(None, "FSDP shard size for dense params (divides dp_shard*cp).")
    tensor_parallel: int = field(1, "Tensor-parallel degree (needs sequence_parallel: true when > 1).")
    context_parallel: int = field(1, "Context-parallel degree (sequence split).")
    context_parallel_method: str = field("colossal", "colossal / ulysses / hybrid.")
    context_parallel_async: bool = field(False, "Async CP communication (ulysses / hybrid only).")
    ulysses_degree_in_cp: Optional[int] = field(None, "Ulysses degree inside CP (hybrid).")
    context_parallel_mask_type: str = field("causal", "Only 'causal' is supported.")
    pipeline_parallel: int = field(1, "Pipeline-parallel degree (stages).")
    pipeline_parallel_layers_per_stage: Optional[Union[str, list[str]]] = field(
        "auto", "'auto' (even split) or one string per stage, e.g. ['0-1', '2-3'].")
    pipeline_parallel_schedule: str = field("1f1b", "1f1b / interleaved_1f1b / gpipe.")
    pipeline_parallel_microbatch_size: int = field(1, "Overwritten with num_accumulation_steps.")
    pipeline_parallel_interleave_num: int = field(1, "Virtual pipeline chunks per rank.")
    pipeline_parallel_overlap_p2p: bool = field(False, "Overlap pipeline send/recv.")
    pipeline_parallel_overlap_b_f: bool = field(False, "Overlap backward and forward.")
    pipeline_parallel_enable_dxdw_split: bool = field(False, "Split input and weight gradients.")
    pipeline_parallel_p2p_transport: str = field("plain", "plain / auto.")
    sequence_parallel: bool = field(False, "Sequence parallel (required with tensor_parallel > 1).")
    enable_mc2: bool = field(False, "Fused matmul+collective kernels (Ascend; needs TP+SP).")
    enable_loss_parallel: bool = field(False, "Vocab-parallel cross-entropy (needs tp > 1).")
    expert_parallel: int = field(1, "Expert-parallel degree (divides dp_shard*cp*tp).")
    npu_nums_per_device: int = field(8, "Devices per node (alltoall_deredundancy).")
    moe_token_dispatcher_type: str = field("alltoall", "alltoall / alltoall_deredundancy.")
    expert_parallel_async_d2h: bool = field(False, "Async device-to-host copy of expert counts.")
    expert_parallel_use_safe_tokens: bool = field(True, "Guard all-to-all against empty experts.")


@section(allow_extra=True)
class OptimizerConfig:
    type: str = field("AdamW", "AdamW or Muon.")
    betas: list[float] = field(factory=lambda: [0.9, 0.95], help="Adam (beta1, beta2).")
    eps: float = field(1e-8, "Adam epsilon.")
    weight_decay: float = field(0.01, "Decoupled weight decay (1-D params and biases get 0).")
    weight_decay_include: Optional[list[str]] = field(None, "Names/globs that always get weight decay.")
    weight_decay_exclude: Optional[list[str]] = field(None, "Names/globs that never get weight decay.")
    enable_fused_opt: bool = field(False, "Use the fused AdamW update.")
    use_fused: bool = field(False, "Alias of enable_fused_opt.")
    amsgrad: bool = field(False, "AMSGrad variant (fused path).")
    maximize: bool = field(False, "Maximise instead of minimise (fused path).")
    enable_cpu_offload: bool = field(False, "Not supported (the reference raises).")
    # --- Muon (optimizer.type: Muon); `betas` is unused by Muon, `eps` is its Newton-Schulz norm floor ---
    matched_adamw_rms: float = field(0.2, "Muon: update RMS matched to AdamW's; scales every orthogonalised update.")
    momentum: float = field(0.95, "Muon: momentum mu of M <- mu*M + G.")
    nesterov: bool = field(True, "Muon: orthogonalise G + mu*M (Nesterov) instead of M.")
    ns_steps: int = field(5, "Muon: Newton-Schulz steps for flat ns_coefficients (ignored by the segmented form).")
    ns_coefficients: list = field(factory=lambda: [3.4445, -4.775, 2.0315],
                                  help="Muon: Newton-Schulz (a, b, c), or segments [[[a, b, c], steps], ...].")
    adamw_betas: list[float] = field(factory=lambda: [0.95, 0.95], help="Muon: (beta1, beta2) of the AdamW fallback.")
    adamw_eps: float = field(1e-8, "Muon: epsilon of the AdamW fallback.")
    adamw_include: Optional[Union[str, list[str]]] = field(
        None, "Muon: fnmatch globs of 2-D/3-D parameters updated by AdamW; null: *word_embeddings*, *output_layer*.")
    qk_clip_enabled: bool = field(True, "Muon: rescale MLA query/key weights whose max attention logit exceeds the threshold.")
    qk_clip_threshold: float = field(100.0, "Muon: QK-clip threshold tau on the per-head max attention logit.")
    comm_strategy: str = field("allgather", "Muon: allgather / allgather_deredundency (one implementation in mftk).")
    use_fused_adamw: bool = field(False, "Muon: fused AdamW kernel for the fallback (same update).")
    phase0_batch_memory_gb: float = field(1.0, "Muon allgather_deredundency: momentum batching budget (no effect in mftk).")
    ns_batch_memory_gb: float = field(1.0, "Muon allgather_deredundency: Newton-Schulz batching budget (no effect in mftk).")
    phase4_batch_memory_gb: float = field(4.0, "Muon allgather_deredundency: apply batching budget (no effect in mftk).")
    swap: bool = field(False, "Optimizer-state swap: Muon rejects true (as the reference); AdamW ignores it.")


@section(allow_extra=True)
class LrSchedulerConfig:
    type: Optional[str] = field(None, "Schedule name, e.g. CosineWithWarmUpLR (required).")
    learning_rate: float = field(1e-5, "Peak learning rate.")
    warmup_steps: Optional[int] = field(None, "Linear warm-up steps.")
    warmup_ratio: Optional[float] = field(None, "Warm-up as a fraction of training.steps (instead of steps).")
    warmup_lr_init: float = field(0.0, "Learning rate at step 0 of warm-up.")
    lr_end: Optional[float] = field(None, "Final LR (cosine: 0; WarmUpStableDecay: 1e-7).")
    num_cycles: float = field(0.5, "Cosine cycles.")
    decay_steps: Optional[int] = field(None, "Cosine / cool-down decay steps.")
    decay_ratio: Optional[float] = field(None, "Decay steps as a fraction of training.steps.")
    decay_start_steps: Optional[int] = field(None, "WarmUpStableDecayLR: step where decay starts.")
    decay_start_ratio: Optional[float] = field(None, "WarmUpStableDecayLR: decay start as a fraction.")
    keep_steps: int = field(0, "ConstantWithCoolDownLR: steps at peak after warm-up.")
    final_steps: int = field(0, "ConstantWithCoolDownLR: steps at lr_end1 before lr_end2.")
    lr_end1: float = field(0.0, "ConstantWithCoolDownLR: LR after the cosine cool-down.")
    lr_end2: Optional[float] = field(None, "ConstantWithCoolDownLR: final LR.")
    power: float = field(1.0, "PolynomialWithWarmUpLR: polynomial power.")
    total_steps: Optional[int] = field(None, "Ignored: forced to training.steps, as in the reference.")


@section(allow_extra=True)
class DatasetConfig:
    """`train_dataset.dataloader.config`: the GPTDataset settings."""

    seed: int = field(1234, "Seed of the dataset's document/sample shuffles.")
    seq_length: Optional[int] = field(None, "Tokens per sample; must equal model.seq_length.")
    data_path: Optional[list[str]] = field(None, "Prefixes, or weight/prefix pairs: [0.3, a_text_document, ...] "
                                           "(weights quoted or not).", path=True)
    train_data_path: Optional[list[str]] = field(None, "Per-split blend for training (instead of data_path).", path=True)
    valid_data_path: Optional[list[str]] = field(None, "Per-split blend for validation.", path=True)
    test_data_path: Optional[list[str]] = field(None, "Per-split blend for test.", path=True)
    split: Optional[str] = field(None, "Train/valid/test proportions, e.g. '1, 0, 0' (needed with data_path).")
    eod: int = field(-1, "End-of-document token id (must match the tokenizer used by preprocess).")
    pad: int = field(-1, "Padding token id.")
    eod_mask_loss: bool = field(False, "Mask the loss on EOD tokens.")
    reset_position_ids: bool = field(False, "Restart position ids after each EOD.")
    reset_attention_mask: bool = field(False, "Block attention across documents.")
    create_attention_mask: bool = field(True, "Return an attention_mask column.")
    create_compressed_eod_mask: Optional[bool] = field(None, "Return actual_seq_len (required key in the reference).")
    create_seq_len_vector: bool = field(False, "Return a per-sample sequence-length vector; not implemented by mftk.")
    eod_pad_length: int = field(128, "Length of actual_seq_len with the compressed EOD mask.")
    compressed_eod_mask_length: Optional[int] = field(None, "Alias of eod_pad_length (overridden by it).")
    add_extra_token_to_sequence: bool = field(True, "Read seq_length + 1 tokens per sample (labels shift).")
    drop_last_partial_validation_sequence: bool = field(True, "Drop the partial last validation sample.")
    num_dataset_builder_threads: int = field(1, "Threads for building indices.")
    path_to_cache: Optional[str] = field(None, "Directory for the index cache (default: next to the data).", path=True)
    mmap_bin_files: Optional[bool] = field(None, "Memory-map .bin files.")
    mock: bool = field(False, "Train on random tokens (mftk: only when set explicitly).")
    s3_cache_path: Optional[str] = field(None, "Unused.")


@section(allow_extra=True)
class DataloaderConfig:
    type: Optional[str] = field(None, "BlendedMegatronDatasetDataLoader / MindDataset / HFDataLoader / OrderedIndexDataLoader.")
    datasets_type: Optional[str] = field(None, "Must be 'GPTDataset' for BlendedMegatronDatasetDataLoader.")
    sizes: Optional[list[int]] = field(None, "[train, valid, test] sample counts (train is used).")
    shuffle: bool = field(False, "Loader-level shuffle (keep False: GPTDataset already shuffles).")
    column_names: list[str] = field(
        factory=lambda: ["input_ids", "labels"], help="Columns passed to the model, in order.")
    python_multiprocessing: bool = field(False, "Use worker processes.")
    config: Optional[DatasetConfig] = field(None, "GPTDataset settings.")
    dataset_files: Optional[list[str]] = field(None, "MindDataset: MindRecord files or directories (one string "
                                               "is one entry; directories are searched in sorted order).", path=True)
    dataset_dir: Optional[str] = field(None, "MindDataset: directory of MindRecord files.", path=True)


@section
class TrainDatasetConfig:
    dataloader: Optional[DataloaderConfig] = field(None, "The dataloader (type is required).")
    drop_remainder: bool = field(True, "Drop a last incomplete batch.")
    num_parallel_workers: int = field(8, "Dataset worker count.")
    prefetch_size: int = field(1, "Batches prefetched.")
    numa_enable: bool = field(False, "NUMA binding for dataset workers.")
    use_distribute_dataset: bool = field(False, "First rank of each tp*cp group reads and broadcasts.")
    balance_enabled: bool = field(False, "Balance attention work across DP ranks (needs the compressed EOD mask): "
                                  "each step's micro-batches are redistributed; no effect at dp 1.")


@section
class HealthCheckpointConfig:
    embedding_local_norm_threshold: float = field(100.0, "Accepted; no effect.")
    global_norm_skip_threshold: float = field(100.0, "Accepted; no effect.")
    global_norm_skip_time: int = field(10, "Accepted; no effect.")


@section
class TrainStateConfig:
    local_norm: Union[bool, str, list[str]] = field("", "Per-parameter gradient norms (substring filter).")
    local_loss: bool = field(False, "Log the loss of each micro-batch.")
    device_norm: Union[bool, str, list[str]] = field(False, "Per-parameter norms at the end of each step.")
    device_loss: bool = field(False, "Log the reduced step loss.")


@section
class TensorboardConfig:
    output_dir: str = field("", "Non-empty enables TensorBoard scalars in this directory.", path=True)
    log_interval: int = field(1, "Write scalars every N steps.")
    queue_size: int = field(1000, "Writer queue size.")


@section
class MoeMonitorConfig:
    save_tokens_per_expert_interval: Optional[int] = field(None, "Every N steps: tokens per expert and imbalance "
                                                            "(max/mean) of each MoE layer, logged, in metrics.jsonl "
                                                            "and TensorBoard (the reference writes nothing).")
    target_layers: Optional[Union[int, list[int]]] = field(None, "Layers to monitor: N (layers 0..N-1) or a list "
                                                           "of layer ids (null: every MoE layer).")


@section
class MonitorConfig:
    health_checkpoint: HealthCheckpointConfig = field(factory=HealthCheckpointConfig, help="Accepted; no effect.")
    train_state: TrainStateConfig = field(factory=TrainStateConfig, help="Loss and norm monitoring.")
    tensorboard: TensorboardConfig = field(factory=TensorboardConfig, help="TensorBoard scalars.")
    moe_monitor: MoeMonitorConfig = field(factory=MoeMonitorConfig, help="MoE token statistics.")


DEVICE_TARGETS = ("CPU", "GPU", "Ascend")  # context.device_target values (engine/device.py uses them)


@section
class ContextConfig:
    mode: int = field(1, "Accepted for compatibility; PyNative is always used.")
    max_device_memory: str = field("59GB", "Accepted for compatibility; unused.")
    device_target: Optional[str] = field(
        None, "CPU, GPU or Ascend (--device overrides it). null: the device MindSpore finds (Ascend, GPU, then CPU); "
        "a device written that is not there stops the run.")


@section
class ProfilerConfig:
    enable_profiling: bool = field(False, "Run MindSpore's profiler over start_step..end_step.")
    start_step: int = field(1, "First profiled step (>= 1).")
    end_step: int = field(1, "Last profiled step (>= start_step).")
    output_path: Optional[str] = field(None, "Output root (default ./profile); rank_<id> below it.", path=True)
    profiler_rank: Optional[list[int]] = field(None, "Ranks to profile (null: all).")
    profiler_level: int = field(0, "0 / 1 / 2.")
    mstx: bool = field(False, "Ascend MSTX markers.")
    profile_memory: bool = field(False, "Record memory.")
    profile_cpu: bool = field(True, "Record CPU activity.")
    with_stack: bool = field(True, "Record Python stacks.")


@section
class RecomputeConfig:
    mode: str = field("None", "None / full / select.")
    full_recompute_layer: Optional[list[str]] = field(None, "Layers for full recompute: ['0-3', 5] (ints or ranges).")
    select_module: Optional[Union[dict[str, Any], list[Any]]] = field(None, "Module glob -> layer ranges.")
    exclude_op: Optional[Union[dict[str, Any], list[Any]]] = field(
        None, "Module-path glob -> layer ranges whose outputs are kept, not recomputed (2.1.0 form; the older list "
        "of op names is refused).")


@section
class RecomputeCommConfig:
    enable: bool = field(False, "Recompute communication ops.")
    select_module: Optional[dict[str, Any]] = field(None, "Module glob -> layer ranges.")


@section
class SwapConfig:
    enable: bool = field(False, "Swap activations to host memory.")
    default_prefetch: int = field(1, "Layers prefetched (1 .. num_layers-1).")
    layer_swap: Optional[list[dict[str, Any]]] = field(None, "List of {layers: ...} entries.")
    op_swap: Optional[list[dict[str, Any]]] = field(None, "List of {layers: ..., op_name: ...} entries.")


@section(allow_extra=True)
class CallbackConfig:
    type: Optional[str] = field(None, "Callback class name, e.g. MaxLogitsMonitor.")
    step_interval: int = field(1, "MaxLogitsMonitor: check every N steps.")


MAX_LOGITS_MONITOR = "MaxLogitsMonitor"
KNOWN_CALLBACKS = (MAX_LOGITS_MONITOR, "MaxLogitsReset")  # MaxLogitsReset: deprecated, the monitor resets


def tracking_requested(config: Any) -> bool:
    """Max-logit tracking is on when the model asks for it, a ``MaxLogitsMonitor`` callback is configured, or
    Muon's QK-clip needs it (MLA models; the reference adds the monitor the same way)."""
    from mftk.config.optimizer_muon import qk_clip_active

    model = getattr(config, "model", None)
    return bool(getattr(model, "track_max_attention_logit", False)) or any(
        getattr(cb, "type", None) == MAX_LOGITS_MONITOR for cb in getattr(config, "callbacks", None) or ()) or (
        hasattr(config, "optimizer") and qk_clip_active(config))


@section
class LoraConfig:
    target_modules: str = field("", "Regex (re.search) of module paths that get adapters, e.g. "
                                "'model.decoder.layers.0.self_attention.linear_qkv' (required).")
    exclude_layers: Optional[str] = field(None, "Regex of module paths whose whole subtree gets no adapter.")
    lora_rank: int = field(8, "Adapter rank r (> 0).")
    lora_alpha: int = field(16, "The update is scaled by lora_alpha / lora_rank.")
    lora_dropout: float = field(0.0, "Dropout on the adapter input, in [0, 1).")
    lora_a_std: float = field(0.01, "Init std of A (normal).")
    lora_b_std: float = field(0.0, "Init std of B (0: B starts at zero, so training starts from the base model).")


@section
class InferenceConfig:
    max_new_tokens: int = field(50, "Tokens generated per prompt (> 0).")
    batch_size: int = field(8, "Prompts per batch (> 0).")
    output: str = field("inference_result.jsonl", "Result file: .jsonl, .json, .txt or no suffix.", path=True)
    input_data: Any = field(None, "A prompt, a .jsonl/text file, a record or a list of them.")


@section
class MftkConfig:
    """Settings only mftk has: MindSpore Transformers ignores a top-level section it does not know."""

    low_priority_dispatch: Optional[bool] = field(
        None, "Dispatch the step from a SCHED_IDLE thread so MindSpore's busy-waiting leaves the cores to "
        "its kernels (1.06-1.19x on CPU). null: on for one-process CPU runs of models with >= 10M parameters; "
        "false on a machine whose cores other busy processes share.")
    update_on_device: Optional[bool] = field(
        None, "Keep the gradient buffers, fp32 master weights, AdamW moments, global norm and clipping on the "
        "device as MindSpore tensors (one fused update per parameter); no weight, gradient or moment crosses to the "
        "host between checkpoints (which either path resumes), but the batch and some model parts still "
        "do (validate-config lists them). null: on for a GPU or Ascend "
        "run, off on CPU, where the host numpy update is faster; true forces it on CPU (CI tests it so); false "
        "keeps the host update on a device. Not with pipeline_parallel > 1 or optimizer.type: Muon (refused).")
    hang_timeout_s: Optional[float] = field(
        None, "Multi-process runs: seconds a rank may make no progress (no step, collective or save) before the "
        "job is ended as hung, with every worker's Python stack in its log and the stopped ranks named; "
        "--hang-timeout overrides it. null: max(60 s, 10x the slowest step, 2x the start-up), and never under "
        "300 s before a rank's first step.")


# Top-level keys the reference reads with getattr although they have no schema: accepted with a
# warning, since mftk does nothing with them either.
KNOWN_EXTRA_TOP_LEVEL = {
    "eval_dataset": "no evaluation runs in PyNative pretraining",
    "use_remove_redundant_dataset": "identical to the plain dataset fetch",
}
RUN_MODES = ("train", "predict")


@section
class Config:
    """A whole training YAML. `model` is typed per `model.model_type` (see `mftk/config/model.py`)."""

    checkpoint: CheckpointConfig = field(factory=CheckpointConfig, help="Saving and loading checkpoints.")
    training: TrainingConfig = field(factory=TrainingConfig, help="Steps, batch sizes, clipping, seed.")
    parallelism: ParallelismConfig = field(factory=ParallelismConfig, help="DP/FSDP/TP/PP/CP/EP degrees.")
    optimizer: OptimizerConfig = field(factory=OptimizerConfig, help="AdamW or Muon settings and weight-decay groups.")
    lr_scheduler: LrSchedulerConfig = field(factory=LrSchedulerConfig, help="Learning-rate schedule.")
    train_dataset: TrainDatasetConfig = field(factory=TrainDatasetConfig, help="Training data.")
    model: Any = field(None, "Model architecture (typed by model_type: qwen3, deepseek_v3, deepseek_v4, qwen3_moe).")
    monitor: MonitorConfig = field(factory=MonitorConfig, help="Training-state monitoring and TensorBoard.")
    context: ContextConfig = field(factory=ContextConfig, help="Accepted for compatibility; ignored.")
    profiler: ProfilerConfig = field(factory=ProfilerConfig, help="MindSpore profiler window.")
    recompute: RecomputeConfig = field(factory=RecomputeConfig, help="Activation recomputation.")
    recompute_comm: RecomputeCommConfig = field(factory=RecomputeCommConfig, help="Recompute of communication.")
    swap: SwapConfig = field(factory=SwapConfig, help="Activation swapping to host.")
    callbacks: list[CallbackConfig] = field(factory=list, help="Extra callbacks: [{type: MaxLogitsMonitor}].")
    lora_config: Optional[LoraConfig] = field(None, "LoRA adapters on the matched layers; every other weight frozen.")
    run_mode: str = field("train", "A string: train (the default) or predict; mftk trains, so predict is refused.")
    inference: Optional[InferenceConfig] = field(None, "Inference settings (run_mode: predict); not used by mftk train.")
    mftk: MftkConfig = field(factory=MftkConfig, help="mftk-only settings (a section the reference ignores).")

    @property
    def dataset(self) -> Optional[DatasetConfig]:
        """The GPTDataset settings, or None when the YAML has none."""
        loader = self.train_dataset.dataloader
        return loader.config if loader is not None else None

    @property
    def model_columns(self) -> tuple[str, ...]:
        """The batch columns passed to the model, in order (``train_dataset.dataloader.column_names``)."""
        loader = self.train_dataset.dataloader
        return tuple(loader.column_names) if loader is not None else tuple(DataloaderConfig().column_names)
