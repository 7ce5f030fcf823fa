"""Parallel-layout arithmetic, memory and FLOPs estimates (pure Python; no MindSpore)."""
