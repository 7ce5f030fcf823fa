"""DeepSeek-V4 (hybrid sliding/compressed/sparse attention, mHC, hash-routed MoE, MTP)."""
