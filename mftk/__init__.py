"""mftk: a typed toolchain for PyNative LLM pretraining with MindSpore."""

__version__ = "0.1.0"
