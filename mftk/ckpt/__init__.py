"""Checkpoints in the MindSpore Transformers layout: safetensors I/O (numpy only), iteration
dirs and tracker, crash-safe saving, loading, inspection, verification and diff.

Nothing here imports MindSpore: the engine converts its tensors to numpy before saving and
converts the numpy arrays it loads back into tensors.
"""
