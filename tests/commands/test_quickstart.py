"""`mftk quickstart` through the CLI: the whole run with every artefact checked, and stopping on failure.

The artefact checks use references independent of mftk: the tokenizer re-encodes the corpus for
the token count and the first document, the `.idx` header is read at the offsets in
megatron-data.md §1.1, and the loss comes from the log with the reference's own regex.
"""
import json
import math
import re
import struct

import numpy as np
import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app

SMALL = ["--max-chars", "20000", "--vocab-size", "512"]  # pydoc topics only: ~0.5 MB, 1-2 s per stage


def test_unknown_model_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["quickstart", "--workdir", str(tmp_path / "qs"), "--model", "llama"])
    assert result.exit_code == 2
    assert "--model 'llama'" in result.stderr and "qwen3, deepseek_v3" in result.stderr
    assert "1/6" not in result.stdout and not (tmp_path / "qs").exists()


def test_workdir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    result = runner.invoke(app, ["quickstart", "--workdir", str(tmp_path / "f")])
    assert result.exit_code == 2
    assert "not a directory" in result.stderr


def test_a_failing_stage_stops_the_run_with_its_exit_code(tmp_path):
    """Preprocess cannot write its .bin (a directory is in the way): stage 3 fails, stage 4 never runs."""
    work = tmp_path / "qs"
    (work / "data" / "quickstart_text_document.bin").mkdir(parents=True)
    result = runner.invoke(app, ["quickstart", "--workdir", str(work), "--nproc", "1", *SMALL])
    assert result.exit_code not in (0, None), result.output
    assert "1/6" in result.stdout and "2/6" in result.stdout and "3/6" in result.stdout
    assert "4/6" not in result.stdout and not (work / "qwen3_quickstart.yaml").exists()
    assert "stage 3/6 failed" in result.stderr and "`mftk preprocess` exited with code" in result.stderr
    assert f"cd {work} && mftk preprocess" in result.stderr
    assert (work / "data" / "corpus.jsonl").is_file() and (work / "data" / "tokenizer.json").is_file()


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("nproc", [1, 2])
def test_whole_quickstart_leaves_every_artefact(tmp_path, monkeypatch, nproc):
    from tokenizers import Tokenizer

    steps, extra = 9, 3
    work = tmp_path / "qs"
    result = runner.invoke(app, ["quickstart", "--workdir", str(work), "--nproc", str(nproc), "--steps", str(steps),
                                 "--resume-steps", str(extra), *SMALL], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for n in range(1, 7):
        assert f"{n}/6" in result.stdout
    for verb in ("preprocess", "validate-config", "plan-parallel", "train", "inspect-ckpt", "resume", "parse-log"):
        assert f"$ mftk {verb} " in result.stdout
    assert "total wall time" in result.stdout and "missing" not in result.stdout

    # 1: corpus, JSON lines of real Python text
    docs = [json.loads(line) for line in (work / "data/corpus.jsonl").read_text().splitlines()]
    assert len(docs) > 50 and all(d["text"] for d in docs)
    assert any(d["source"].startswith("pydoc_data.topics:") for d in docs)

    # 2: tokenizer, vocab as asked, EOD is id 0
    tok = Tokenizer.from_file(str(work / "data/tokenizer.json"))
    assert tok.get_vocab_size() == 512 and tok.token_to_id("<|endoftext|>") == 0

    # 3: .bin/.idx — one sequence per document, tokens + EOD, uint16 (code 8)
    expected = [tok.encode(d["text"]).ids + [0] for d in docs]
    idx = (work / "data/quickstart_text_document.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<QBQQ", idx, 9) == (1, 8, len(docs), len(docs) + 1)
    lengths = np.frombuffer(idx, dtype="<i4", count=len(docs), offset=34)
    assert lengths.tolist() == [len(e) for e in expected]
    tokens = np.fromfile(work / "data/quickstart_text_document.bin", dtype="<u2")
    assert tokens.size == sum(map(len, expected)) and tokens[: len(expected[0])].tolist() == expected[0]

    # 4: config points at the data and outputs, and is valid (paths relative to the work directory)
    monkeypatch.chdir(work)
    from mftk.config.load import load_config

    cfg = load_config("qwen3_quickstart.yaml").config
    assert cfg.dataset.data_path == ["1", "data/quickstart_text_document"]
    assert cfg.checkpoint.save_path == "output/checkpoint" and cfg.training.steps == steps
    assert cfg.model.vocab_size == 512

    # 5-6: checkpoints at every third of training and the end of resume; the tracker names the last
    ckpt = work / "output/checkpoint"
    dirs = sorted(p.name for p in ckpt.glob("iteration_*"))
    assert dirs[-1] == f"iteration_{steps + extra:08d}" and f"iteration_{steps:08d}" in dirs
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps + extra)
    assert list((ckpt / dirs[-1]).glob("*-model-*.safetensors"))

    # 6: the plot is a non-empty PNG; the log holds steps 1..steps+extra and the loss went down
    png = (work / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    log = (work / "output/log/rank_0/info.log").read_text()
    found = [int(s) for s in re.findall(r"step:\[\s*(\d+)/", log)]
    losses = [float(x) for x in re.findall(r"loss:\s+(\d+\.\d+)", log)]
    assert found == list(range(1, steps + extra + 1)) and len(losses) == len(found)
    assert losses[-1] < losses[0] - 0.3, losses
    # A freshly initialised model predicts nearly uniformly: the first loss is about ln(vocab).
    assert losses[0] == pytest.approx(math.log(512), abs=0.1), losses
    assert yaml.safe_load((work / "qwen3_quickstart.yaml").read_text())["training"]["steps"] == steps
