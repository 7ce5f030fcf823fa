"""What every config field does in mftk: one table, next to the config model, with three answers.

- ``implemented`` — the engine applies the field; the row names the pytest node id of the test that shows
  its effect (it sets the field and asserts a difference from the default); ``only`` says which values,
  the others are refused with what the engine does instead. `scripts/field_effects.py` runs each such test
  with the field forgotten after validation (`config.mutant`) and lists the fields whose test still passes.
- ``no effect`` — accepted on purpose and without effect, with why (an Ascend kernel switch whose math
  is the same, a setting the reference ignores too); `validate-config` shows a note when it is set.
- ``refused`` — not applied by mftk: a value other than the default is an error naming the YAML path
  and what to use instead. A key that is accepted and silently ignored is never an answer.

``rule=True``: the note or error is given by the rule module that owns the field (`rules.py`,
`support.py`, `model.py`) with a message of its own; `check_statuses` leaves it to that module.
``accepts`` holds the accepted values as code next to ``only``, their text: one declaration per field
(`support.py` refuses the other values of the ``rule`` rows with ``engine``; `check_statuses` the others).
`tests/config/test_status.py` walks every attrs field of every section and model family, so a new
field without a row fails; it also sets every refused field and expects the error at its path.
"""
from __future__ import annotations

import typing
from typing import Any, Callable, Iterator

import attrs

from mftk.errors import Problem

IMPLEMENTED, NO_EFFECT, REFUSED = "implemented", "no effect", "refused"


@attrs.frozen
class Status:
    kind: str
    why: str = ""  # implemented: the proving test's node id ("[]": the field's path); no effect: why; refused: instead
    rule: bool = False  # the owning rule module reports it (own message)
    only: str = ""  # implemented for these values only (the others are refused, by the owning rule)
    example: Any = None  # a refused value, for the test that sets it (default: the opposite bool)
    multi_only: bool = False  # refused only with more than one process (the reference reads it only then)
    slow: bool = False  # implemented: the proving test takes more than ~5 s (CI runs the fastest of the others)
    loader: bool = False  # implemented: read while the config is loaded (the family, a spelling): no mutant applies
    # the accepted values as code, next to ``only`` (their text): `support.unsupported_model_settings` refuses the
    # others with ``engine`` (what the engine does instead); ``families``: only these model types are asked,
    # ``exempt``: model types whose own layers implement every value
    accepts: Callable[[Any], bool] | None = None
    engine: str = ""
    families: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()

    def test_for(self, path: str) -> str:
        """The proving test's node id for the field at ``path`` (implemented rows)."""
        return self.why[:-2] + f"[{path}]" if self.why.endswith("[]") else self.why

    @property
    def label(self) -> str:
        return f"{self.kind} (only {self.only})" if self.only else self.kind


def _impl(test: str, **kw: Any) -> Status:
    return Status(IMPLEMENTED, test, **kw)


def _inert(why: str, **kw: Any) -> Status:
    return Status(NO_EFFECT, why, **kw)


def _refused(instead: str, **kw: Any) -> Status:
    return Status(REFUSED, instead, **kw)


def _same(test: str, names: str) -> dict[str, Status]:
    return {n: _impl(test) for n in names.split()}


ASCEND = "an Ascend kernel / communication-overlap switch: the same numbers, mftk has no such kernel"
PERF = "a loader performance setting: the same batches in the same order"
# recompute replays layers only with several processes, as the reference (engine/recompute.py); on one
# process config/rules.py notes that it has no effect. Its proving test loads the config for two.
NO_EVAL = "no evaluation runs in PyNative pretraining (the reference builds it and never uses it)"

_FX = "tests/engine/test_field_effects.py::test_field_changes_what_the_engine_does[]"  # a run with it vs without
_MON = "tests/engine/test_field_effects.py::test_monitor_setting_reaches_the_profiler_or_writer[]"
_RC = "tests/engine/test_field_effects.py::test_recompute_setting_changes_the_replayed_cells[]"
_SETUP = "tests/engine/test_field_effects.py::test_process_setup_takes_the_device_and_determinism_from_the_config"
_NAN = "tests/engine/test_nan_limit.py::test_the_config_sets_skipping_and_its_limit"
_LORA = "tests/engine/test_lora.py"
_PP = "tests/commands/test_train_pipeline.py"
_DIST = ("tests/engine/parallel/test_parallelize.py::"
         "test_the_config_sets_the_interleaved_stages_and_the_context_parallel_method")
_MR = "tests/data/test_mindrecord.py::test_the_config_selects_mindrecord_and_keeps_a_partial_last_batch"


def _fx(names: str) -> dict[str, Status]:
    return {n: _impl(_FX) for n in names.split()}


def _slow(test: str, **kw: Any) -> Status:
    return _impl(test, slow=True, **kw)


SECTIONS: dict[str, dict[str, Status]] = {
    "checkpoint": {
        **_fx("enable_save save_path save_max save_interleaved_steps no_save_optim async_save prefix load_path "
              "no_load_optim"),
        "remove_redundancy": _refused("a de-duplicated save is not implemented by mftk: every data-parallel replica "
                                      "writes its own shard files; set remove_redundancy: false", multi_only=True),
        "load_balanced": _slow("tests/commands/test_train_distributed.py::"
                               "test_balanced_resume_reads_each_shard_once_and_is_bit_exact"),
        "load_worker_number": _inert("the reference ignores it too (2.0 §1.5)"),
        "save_global_layout_cache": _inert("metadata is computed from the placement table on every save, "
                                           "at no cost to cache"),
        "reshard_worker_num": _inert("HF checkpoints are read in one process: the same tensors"),
        "save_trainable_only": _slow(f"{_LORA}::test_adapter_only_saves_start_from_the_base_and_resume_bit_exactly"),
        "base_load_path": _slow(f"{_LORA}::test_the_base_is_what_the_run_trains_on"),
    },
    "training": {
        **_fx("steps local_batch_size global_batch_size max_norm seed rampup_batch_size"),
        "deterministic": _impl(_SETUP),
        **_same(_NAN, "use_skip_step_on_nan max_consecutive_skipped_steps"),
    },
    "parallelism": {
        # several processes (msrun): slow, run by `scripts/field_effects.py` without --fast
        # the pure-DP run (1): its FSDP default would shard the weights over both workers (dp_shard[2])
        "data_parallel_shard": _slow("tests/commands/test_train_distributed.py::"
                                     "test_deepseek_dp2_syncs_moe_losses_and_expert_bias"),
        "tensor_parallel": _slow("tests/commands/test_train_model_parallel.py::test_tp2_matches_single_process"),
        "expert_parallel": _slow("tests/commands/test_train_model_parallel.py::test_ep2_matches_single_process"),
        "pipeline_parallel": _slow(f"{_PP}::test_pp2_log_lines_per_stage"),
        **{n: _slow(f"{_PP}::test_pp2_gpipe_explicit_uneven_split_matches_single_process")
           for n in ("pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule")},
        # what run.distribute builds on a rank from the loaded config (their msrun runs: test_train_layouts.py)
        **{n: _impl(_DIST) for n in ("pipeline_parallel_interleave_num", "context_parallel_method",
                                     "ulysses_degree_in_cp")},
        "context_parallel": _slow("tests/commands/test_train_context_parallel.py::test_cp2_matches_single_process"),
        # tensor parallel always splits the sequence (refused with false); causal is the one mask
        "sequence_parallel": _impl("tests/config/test_runnable.py", rule=True, only="true with tensor_parallel > 1"),
        "context_parallel_mask_type": _impl("tests/config/test_rules.py", rule=True, only="causal"),
        "data_parallel_shard_strategy": _inert("the reference ignores it too (2.0 §1.5)"),
        "reshard_after_forward_policy": _inert("an FSDP memory / communication trade-off: the same numbers "
                                               "(the memory estimate of plan-parallel reads it)"),
        "cpu_offload": _refused("FSDP CPU offload is not implemented by mftk: set cpu_offload: false"),
        "disable_gradient_division": _refused("mftk's FSDP sums gradients and the loss scale averages them "
                                              "(the default): set disable_gradient_division: true", example=False),
        "dense_fsdp_shard_size": _refused("a separate FSDP shard size for dense parameters is not implemented: "
                                          "remove it (dense parameters shard over data_parallel_shard)", example=2),
        "context_parallel_async": _inert(ASCEND),
        "pipeline_parallel_microbatch_size": _inert("overwritten with num_accumulation_steps, as in the reference"),
        "pipeline_parallel_overlap_p2p": _inert(ASCEND),
        "pipeline_parallel_overlap_b_f": _inert(ASCEND),
        "pipeline_parallel_enable_dxdw_split": _inert(ASCEND),
        "pipeline_parallel_p2p_transport": _inert(ASCEND),
        "enable_mc2": _inert(ASCEND),
        "enable_loss_parallel": _inert("tensor parallel always uses the vocabulary-parallel loss (the same value)"),
        "npu_nums_per_device": _inert("read only by alltoall_deredundancy, an Ascend dispatch variant"),
        "moe_token_dispatcher_type": _inert("alltoall_deredundancy routes the same tokens with less traffic "
                                            "between Ascend devices; mftk uses alltoall"),
        "expert_parallel_async_d2h": _inert(ASCEND),
        "expert_parallel_use_safe_tokens": _inert("mftk's all-to-all handles empty experts either way"),
    },
    "optimizer": {
        **_fx("type betas eps weight_decay weight_decay_include weight_decay_exclude"),
        **{n: _inert("the reference's fused AdamW kernel computes the same update; mftk has one implementation "
                     "(it does not reproduce the fused path's lr(-1) on the first step)")
           for n in ("enable_fused_opt", "use_fused")},
        **_fx("matched_adamw_rms momentum nesterov ns_steps ns_coefficients adamw_betas adamw_eps adamw_include "
              "qk_clip_enabled qk_clip_threshold"),
        "comm_strategy": _inert("allgather_deredundency is a communication variant of the same Muon update; "
                                "mftk has one implementation"),
        "use_fused_adamw": _inert(ASCEND),
        **{n: _inert("a memory batching budget of allgather_deredundency: the same update")
           for n in ("phase0_batch_memory_gb", "ns_batch_memory_gb", "phase4_batch_memory_gb")},
        "swap": _inert("AdamW ignores it, as the reference's does (Muon refuses true)"),
        "amsgrad": _refused("AMSGrad is not implemented by mftk's AdamW: set amsgrad: false"),
        "maximize": _refused("maximising is not implemented by mftk's AdamW: set maximize: false"),
        "enable_cpu_offload": _refused("", rule=True),
    },
    "lr_scheduler": {
        **_fx("type learning_rate warmup_steps warmup_ratio warmup_lr_init lr_end num_cycles decay_steps decay_ratio "
              "decay_start_steps decay_start_ratio keep_steps final_steps lr_end1 lr_end2 power"),
        "total_steps": _inert("forced to training.steps, as in the reference"),
    },
    "train_dataset": {
        "drop_remainder": _impl(f"{_MR}[dataset_files]"),  # the Megatron loader reads whole steps only
        "num_parallel_workers": _inert(PERF), "prefetch_size": _inert(PERF), "numa_enable": _inert(PERF),
        "use_distribute_dataset": _inert("every rank reads its own micro-batches: the same samples the "
                                         "broadcast would deliver"),
        # the loaders built from the loaded config (the dp2 msrun run's losses: test_train_distributed.py)
        "balance_enabled": _impl("tests/data/test_balance.py::test_the_loaded_config_turns_balancing_on", rule=True),
    },
    "train_dataset.dataloader": {
        **_fx("sizes shuffle column_names"),
        "type": _impl(f"{_MR}[dataset_files]"),
        "datasets_type": _impl("tests/config/test_rules.py", rule=True, only="GPTDataset"),
        **{n: _impl(f"{_MR}[{n}]") for n in ("dataset_files", "dataset_dir")},
        "python_multiprocessing": _inert(PERF),
    },
    "train_dataset.dataloader.config": {
        "seq_length": _impl("tests/config/test_rules.py", rule=True, only="model.seq_length (validated equal)"),
        **_fx("seed data_path train_data_path split eod pad eod_mask_loss "
              "reset_attention_mask create_attention_mask create_compressed_eod_mask eod_pad_length "
              "add_extra_token_to_sequence path_to_cache mock"),
        "reset_position_ids": _inert("it resets the position_ids column at each EOD, which the model ignores, as "
                                     "the reference's does: RoPE positions are always 0..S-1 (models.md §7.10)"),
        "drop_last_partial_validation_sequence": _inert("it changes only the validation split's indices (and the "
                                                        "cache description, as the reference writes it); "
                                                        "no evaluation runs"),
        "valid_data_path": _inert(NO_EVAL), "test_data_path": _inert(NO_EVAL),
        "create_seq_len_vector": _refused("", rule=True),
        "compressed_eod_mask_length": _inert("the reference overrides it with eod_pad_length"),
        "num_dataset_builder_threads": _inert("the same indices are built in one thread"),
        "mmap_bin_files": _inert("the same tokens are read either way"),
        "s3_cache_path": _inert("the reference ignores it too"),
    },
    "monitor.health_checkpoint": {
        n: _inert("the reference ignores the whole section (2.0 §1.5)")
        for n in ("embedding_local_norm_threshold", "global_norm_skip_threshold", "global_norm_skip_time")
    },
    "monitor.train_state": _fx("local_norm local_loss device_norm device_loss"),
    "monitor.tensorboard": {**_fx("output_dir log_interval"), "queue_size": _impl(_MON)},
    "monitor.moe_monitor": _fx("save_tokens_per_expert_interval target_layers"),
    "context": {
        "mode": _inert("PyNative is always used (the reference ignores the section too)"),
        "max_device_memory": _inert("the reference ignores the section too"),
        "device_target": _impl(_SETUP),
    },
    "profiler": _same(_MON, "enable_profiling start_step end_step output_path profiler_rank profiler_level mstx "
                      "profile_memory profile_cpu with_stack"),
    "recompute": {
        **_same(_RC, "mode full_recompute_layer select_module exclude_op"),
    },
    "recompute_comm": {
        **_same(_RC, "enable select_module"),
    },
    "swap": {
        "enable": _refused("swapping activations to host memory is not built: set swap.enable: false", rule=True),
        **{n: _inert("read only with swap.enable, which is refused") for n in ("default_prefetch", "layer_swap",
                                                                               "op_swap")},
    },
    "callbacks": {"type": _impl(_FX),
                  "step_interval": _impl("tests/engine/test_max_logits.py::"
                                         "test_monitor_logs_every_step_interval_steps")},
    "lora_config": _fx("target_modules exclude_layers lora_rank lora_alpha lora_dropout lora_a_std lora_b_std"),
    "inference": {n: _inert("read by the reference only with run_mode: predict; mftk trains", rule=True)
                  for n in ("max_new_tokens", "batch_size", "output", "input_data")},
    "mftk": {"low_priority_dispatch": _impl("tests/engine/test_field_effects.py::"
                                            "test_low_priority_dispatch_reaches_the_trainer"),
             "update_on_device": _impl("tests/engine/test_device_update.py::"
                                       "test_device_path_ran_on_request_and_host_path_by_default_on_cpu"),
             "hang_timeout_s": _impl("tests/engine/test_watchdog.py::test_hang_timeout_key_is_read_and_checked")},
    "": {"run_mode": _impl("tests/config/test_compat21.py", only="train", rule=True)},
}

_FP32 = "mftk computes and stores in float32 on CPU"
_SUPPORT = "tests/config/test_support.py"
_MLP = "tests/engine/test_mlp_variants.py"
MODEL: dict[str, Status] = {
    "seq_length": _impl("tests/engine/test_field_effects.py::test_model_seq_length_is_what_each_step_counts"),
    **_fx("initializer_range rms_norm_eps rope_theta rope_scaling attention_bias position_embedding_type "
          "tie_word_embeddings track_max_attention_logit vocab_size hidden_size intermediate_size num_hidden_layers "
          "num_attention_heads num_key_value_heads head_dim max_position_embeddings hidden_dropout pad_token_id "
          "q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim qk_layernorm "
          "rotary_scaling_factor beta_fast beta_slow mscale mscale_all_dim"),
    # the family: read while the YAML is structured, before any rule or mutant
    "model_type": _impl("tests/config/test_model.py::test_bad_model_type", loader=True),
    "architectures": _impl("tests/config/test_convert.py::"
                           "test_model_structure_is_lifted_one_level_with_a_string_architecture", loader=True),
    **_fx("moe_intermediate_size n_shared_experts moe_shared_expert_intermediate_size use_shared_expert_gating "
          "n_routed_experts num_experts_per_tok routed_scaling_factor n_group topk_group norm_topk_prob moe_layer_freq "
          "first_k_dense_replace moe_router_score_function moe_router_enable_expert_bias moe_router_bias_update_rate "
          "moe_router_load_balancing_type moe_aux_loss_coeff"),
    "moe_grouped_gemm": _impl(_SUPPORT, rule=True, only="true", example=False),
    "multi_latent_attention": _impl("tests/config/test_model.py", rule=True, only="true (DeepSeek-V3)", example=False),
    "moe_router_pre_softmax": _inert(
        "routing always takes the softmax over all experts before top-k, as MindSpore Transformers 2.1's PyNative "
        "router does (pynative/transformers/moe/router.py, TopKRouter.construct: scores, then topk); the field "
        "only lifts the reference's top-1 softmax check (transformer_config.py)"),
    **_fx("num_nextn_predict_layers mtp_loss_scaling_factor"),
    **{n: _inert(_FP32, rule=True) for n in ("compute_dtype", "params_dtype", "embedding_params_dtype")},
    **{n: _inert(_FP32) for n in ("layernorm_compute_dtype", "rotary_dtype", "moe_router_dtype")},
    # GELU (exact erf, as the reference's) and non-gated MLPs are built for every dense MLP and for gated experts
    # (model.py's grammar owns the names); routed experts are gated only (``weight1`` holds [gate | up]);
    # DeepSeek-V4's experts are transformers' clamped SwiGLU.
    "hidden_act": _impl(_MLP, rule=True, only="silu / fusedswiglu / gelu", example="relu",
                        accepts=lambda v: v in ("silu", "fusedswiglu"), families=("deepseek_v4",),
                        engine="DeepSeek-V4's experts are the clamped SwiGLU of transformers' DeepseekV4: use silu"),
    "gated_linear_unit": _impl(_MLP + "::test_gpt_style_model_validates_and_builds_a_plain_mlp", rule=True,
                               accepts=lambda v: v is True,
                               families=("qwen3_moe", "deepseek_v3", "deepseek_mtp", "deepseek_v4"),
                               engine="routed experts are gated (weight1 holds [gate | up]): set true; a non-gated "
                               "MLP is built for dense models (model_type qwen3)"),
    "add_bias_linear": _impl(_SUPPORT, rule=True, only="false", accepts=lambda v: v is False,
                             engine="linear layers have no bias: set false"),
    "apply_residual_connection_post_layernorm": _impl(_SUPPORT, rule=True, only="false", accepts=lambda v: v is False,
                                                      engine="residuals are taken before the norm"),
    "rotary_interleaved": _impl(_SUPPORT, rule=True, only="false", accepts=lambda v: v is False,
                                engine="rotary pairs are the two halves (not interleaved)"),
    "rotary_percent": _impl(_SUPPORT, rule=True, only="1.0", example=0.5, accepts=lambda v: v == 1.0,
                            engine="the whole rope head dim is rotated"),
    "moe_router_force_expert_balance": _impl(_SUPPORT, rule=True, only="false", accepts=lambda v: v is False,
                                             engine="routing follows the router scores"),
    "moe_apply_probs_on_input": _impl(_SUPPORT, rule=True, only="false", accepts=lambda v: v is False,
                                      engine="routing probabilities scale the expert outputs"),
    "activation_func_clamp_value": _impl(_SUPPORT, rule=True, only="null", example=7.0, accepts=lambda v: v is None,
                                         engine="the experts' SwiGLU is not clamped", exempt=("deepseek_v4",)),
    "calculate_per_token_loss": _refused("", rule=True),
    "attention_dropout": _inert("the reference's attention has no dropout either (models.md §1.3)"),
    # model.py's grammar owns these two (one error per path: issue 36)
    "normalization": _impl("tests/engine/test_hf_parity.py", rule=True, only="RMSNorm", example="LayerNorm"),
    "fused_norm": _impl("tests/engine/test_hf_parity.py", rule=True, only="true", example=False),
    "ignore_token_id": _impl("tests/engine/test_model.py", only="-100", example=0, accepts=lambda v: v == -100),
    "use_eod_attn_mask_compression": _refused(
        "document-packed (TND) attention is not implemented by mftk: set it false (reset_attention_mask: true "
        "with an attention_mask column blocks attention across documents)"),
    "apply_rope_fusion": _inert(ASCEND), "moe_permute_fusion": _inert(ASCEND),
    "use_flash_attention": _inert(ASCEND), "use_attn_mask_compression": _inert(ASCEND),
    "is_dynamic": _inert("every batch has seq_length tokens: the mask is never sliced"),
    "chunk_loss_num": _inert("the chunked cross-entropy gives the same value; mftk computes it in one piece"),
    # DeepSeek-V4 and Qwen3-MoE
    **_fx("o_groups o_lora_rank compress_ratios csa_window_size compress_rope_theta csa_dense_mode index_n_heads "
          "index_head_dim index_topk dsa_indexer_loss_coeff num_residual_streams mhc_sinkhorn_iterations "
          "mhc_init_gating_factor hc_eps num_hash_layers original_max_position_embeddings"),
    "experimental_attention_variant": _impl("tests/engine/test_deepseek_v4_mla.py", rule=True,
                                            only="dsv4_hybrid, mla", example="dsa"),
    "enable_hyper_connections": _impl("tests/engine/test_deepseek_v4.py", rule=True, only="true"),
    "use_fused_mhc": _impl("tests/engine/test_deepseek_v4.py", rule=True, only="false"),
    "apply_dsa_kernel_fusion": _inert(ASCEND),
    "dsa_indexer_use_sparse_loss": _inert("the reference's CSA indexer loss does not read it either"),
    **_fx("num_experts decoder_sparse_step mlp_only_layers"),
    "use_sliding_window": _impl("tests/engine/test_train_families.py", rule=True, only="false"),
    "bos_token_id": _inert("not used in training (the reference's neither)"),
    "eos_token_id": _inert("not used in training (the reference's neither)"),
}


def proving_tests() -> Iterator[tuple[str, str, bool]]:
    """(YAML path, proving test node id, slow) of every implemented field a forgetting mutant applies to:
    not the ``only`` rows (nothing but the default is accepted, so nothing can be forgotten: the refusal of
    any other value is their test) and not the ``loader`` rows (read before the mutant runs)."""
    rows = [(f"{s}.{n}".lstrip("."), st) for s, table in SECTIONS.items() for n, st in table.items()]
    rows += [(f"model.{n}", st) for n, st in MODEL.items()]
    for path, st in rows:
        if st.kind == IMPLEMENTED and not st.only and not st.loader:
            yield path, st.test_for(path), st.slow


def status_of(path: str) -> Status | None:
    """The row of a dotted YAML path (list items without indices: ``callbacks.type``); None if unknown."""
    if path.startswith("model."):
        return MODEL.get(path[len("model."):])
    section, _, name = path.rpartition(".")
    return SECTIONS.get(section, {}).get(name)


def leaf_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, attrs.Attribute, type | None]]:
    """(dotted path, attrs field, the attrs class of a nested section or None) of every field, depth first."""
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        if f.name == "model" and not prefix:
            continue
        tp = hints[f.name]
        nested = [a for a in (tp, *typing.get_args(tp)) if attrs.has(a)]
        if not nested:
            for a in typing.get_args(tp):
                nested += [b for b in typing.get_args(a) if attrs.has(b)]
        path = f"{prefix}{f.name}"
        if nested:
            yield from leaf_fields(nested[0], f"{path}.")
        else:
            yield path, f, None


def _default(f: attrs.Attribute) -> Any:
    d = f.default
    return d.factory() if isinstance(d, attrs.Factory) else d  # type: ignore[arg-type]


def check_statuses(config: Any, *, world_size: int = 1, reported: frozenset[str] = frozenset()) -> list[Problem]:
    """Errors for refused fields set to another value than their default, notes for no-effect ones.
    ``reported``: paths that already have a problem (the owning rule said more)."""
    problems: list[Problem] = []
    for path, value, default in _set_values(config):
        st = status_of(_strip_index(path))
        if st is None or st.rule or path in reported:
            continue
        name = path.rsplit(".", 1)[-1]
        if st.kind == REFUSED and st.multi_only and world_size == 1:
            problems.append(Problem(path=path, value=value, severity="note", message="no effect on one process "
                                    "(the reference applies it only with more); with more, mftk refuses it: "
                                    + st.why))
        elif st.kind == REFUSED:
            problems.append(Problem(path=path, value=value, message="not applied by mftk", hint=st.why))
        elif st.kind == NO_EFFECT:
            problems.append(Problem(path=path, value=value, severity="note", message=f"no effect in mftk: {st.why}"))
        elif path.startswith("model.") and st.accepts is not None and not st.accepts(value):
            problems.append(Problem(path=path, value=value, message=f"{value!r} is not implemented by mftk's "
                                    f"engine (only {st.only})", hint=f"set {name}: {st.only}"))
    return problems


def _strip_index(path: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "", path)


def _set_values(config: Any) -> Iterator[tuple[str, Any, Any]]:
    """(path, value, default) of every leaf whose value differs from its default (list items indexed)."""
    yield from _walk(config, "")
    model = getattr(config, "model", None)
    if model is not None and attrs.has(type(model)):
        for f in attrs.fields(type(model)):
            value = getattr(model, f.name)
            if value != _default(f):
                yield f"model.{f.name}", value, _default(f)


def _walk(obj: Any, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    for f in attrs.fields(type(obj)):
        if f.name == "model" and not prefix:
            continue
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if attrs.has(type(value)):
            yield from _walk(value, f"{path}.")
        elif isinstance(value, list) and value and all(attrs.has(type(v)) for v in value):
            for i, item in enumerate(value):
                yield from _walk(item, f"{path}[{i}].")
        elif value is not None or _default(f) is not None:
            if value != _default(f):
                yield path, value, _default(f)


def status_comment(path: str) -> str:
    """The ``--print-resolved`` comment of a field that is not (fully) implemented; "" otherwise."""
    st = status_of(_strip_index(path))
    if st is None or (st.kind == IMPLEMENTED and not st.only):
        return ""
    if st.kind == IMPLEMENTED:
        return f"implemented only: {st.only}"
    return f"{st.kind}: {st.why}" if st.why else st.kind
