"""Qwen3 (dense, GQA + qk-norm)."""
