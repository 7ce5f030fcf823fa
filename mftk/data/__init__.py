"""Data: JSON/JSONL reading, tokenisation, Megatron .bin/.idx files, blending and GPT indices."""
