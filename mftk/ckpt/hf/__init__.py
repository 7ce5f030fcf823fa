"""Hugging Face ``transformers`` checkpoint names and layouts ↔ the reference's, one module per family (numpy only).

Each family module has ``hf_to_mf(hf, cfg)`` and ``mf_to_hf(mf, cfg)``; `mftk.config.families` names
which module serves which ``model_type``.
"""
