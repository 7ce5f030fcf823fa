"""Qwen3-MoE (GQA + qk-norm attention, softmax-routed experts)."""
