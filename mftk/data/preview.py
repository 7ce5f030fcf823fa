"""`validate-config --show-samples`: what a given rank will be trained on, before any training.

Uses exactly the loader the trainer uses (`build_train_dataset` with the rank's data shard), so
what is shown is what is fed: blended/dataset indices, token ids and, with a tokenizer, text.
"""
from __future__ import annotations

from typing import Any

from mftk.config.sections import Config
from mftk.errors import InputError
from mftk.derive import layout_from_config
from mftk.progress import NULL_PROGRESS, Progress


def preview_samples(config: Config, *, world_size: int = 1, rank: int = 0, n: int = 4, start: int = 0,
                    tokenizer: str | None = None, progress: Progress = NULL_PROGRESS) -> dict[str, Any]:
    """{"samples": [...], "warnings": [...], "dp_rank": r, "dp_size": d} for rank `rank`'s loader."""
    from mftk.data.loader import build_train_dataset, show_samples

    if not 0 <= rank < world_size:
        raise InputError(message=f"--rank {rank} is outside the world of {world_size} rank(s)",
                         hint=f"use a rank in 0..{world_size - 1} (and --world-size for multi-process layouts)")
    layout = layout_from_config(config.parallelism, world_size)
    data = build_train_dataset(config.train_dataset.dataloader,
                               global_batch_size=config.training.global_batch_size,
                               local_batch_size=config.training.local_batch_size,
                               dp_size=layout.dp, dp_rank=layout.dp_rank(rank),
                               drop_remainder=config.train_dataset.drop_remainder,
                               seq_length=config.model.seq_length, vocab_size=config.model.vocab_size,
                               progress=progress)
    records = [r.to_json() | {"position": r.position, "blended_index": r.blended_index, "prefix": r.prefix}
               for r in show_samples(data, n, start=start)]
    if tokenizer is not None:
        from mftk.data.tokenize import load_tokenizer

        tok = load_tokenizer(tokenizer).tokenizer
        for r in records:
            r["text"] = tok.decode(r["input_ids"], skip_special_tokens=False)
    return {"samples": records, "warnings": list(data.warnings), "dp_rank": layout.dp_rank(rank),
            "dp_size": layout.dp}
