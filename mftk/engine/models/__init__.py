"""Model families. Each family package holds ``spec.py`` (MindSpore spec builder, registered on import)
and ``state_dict.py`` (numpy-only HF ↔ reference name/layout mapping)."""

FAMILY_SPEC_MODULES = ("mftk.engine.models.qwen3.spec", "mftk.engine.models.deepseek_v3.spec",
                       "mftk.engine.models.deepseek_v4.spec", "mftk.engine.models.qwen3_moe.spec")
