"""DeepSeek-V3 (MLA + MoE + MTP)."""
