"""Helpers for engine and command tests: a tiny token corpus (.bin/.idx) and tiny configs from the templates."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_corpus(prefix: Path, *, vocab: int = 256, docs: int = 60, seed: int = 0) -> Path:
    """Documents of a learnable pattern (counting sequences mod vocab) so loss visibly drops."""
    from mftk.data.indexed import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    with IndexedDatasetBuilder(prefix, np.uint16) as b:
        for _ in range(docs):
            start, n = int(rng.integers(1, vocab)), int(rng.integers(40, 120))
            doc = (start + np.arange(n)) % (vocab - 1) + 1
            b.add_document([np.append(doc, 0).astype(np.uint16)])
        b.finalize()
    return prefix


def tiny_raw(template: str, corpus: Path, save_path: Path, *, steps: int = 4, gbs: int = 2, lbs: int = 1,
             seq: int = 32, **training) -> dict:
    raw = yaml.safe_load((ROOT / "templates" / template).read_text())
    raw = copy.deepcopy(raw)
    raw["training"].update({"steps": steps, "global_batch_size": gbs, "local_batch_size": lbs, **training})
    raw["checkpoint"].update({"save_path": str(save_path), "save_interleaved_steps": 2, "save_max": 10})
    dl = raw["train_dataset"]["dataloader"]
    dl["sizes"] = [max(64, steps * gbs * 4), 0, 0]
    dl["config"].update({"seq_length": seq, "data_path": ["1", str(corpus)], "path_to_cache": str(save_path.parent / "cache")})
    raw["model"].update({"seq_length": seq, "vocab_size": 256})
    if "max_position_embeddings" in raw["model"]:
        raw["model"]["max_position_embeddings"] = 8
    raw["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 3.0e-3, "warmup_steps": 1}
    return raw


def load(raw: dict, *overrides: str):
    from mftk.config.load import load_data

    return load_data(copy.deepcopy(raw), source="<test>", overrides=overrides)


def train_tiny_via_cli(d: Path, *, steps: int = 2, gbs: int = 1) -> Path:
    """Write a tiny Qwen3 config under `d` and train it with `mftk train` (checkpoints in d/ckpt)."""
    import yaml
    from tests.helpers.cli import runner

    from commands.app import app

    corpus = write_corpus(d / "tiny_text_document")
    cfg = d / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=steps, gbs=gbs)))
    r = runner.invoke(app, ["train", str(cfg), "--output-dir", str(d / "out")])
    assert r.exit_code == 0, r.output
    return cfg
