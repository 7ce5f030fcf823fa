"""--num-shards/--shard-index: N shards merged in shard order are byte-identical to one run."""
from __future__ import annotations

import gzip
import json
import random

import pytest
from typer.testing import CliRunner

from commands.app import app
from mftk.data.indexed import IndexedDataset
from mftk.data.preprocess import preprocess
from mftk.data.shards import shard_name, shard_pieces
from mftk.errors import DataFormatError, InputError
from tests.helpers.preprocess import DOCS, EXAMPLES, example_corpus as _example_corpus, files, reference_write, write_jsonl


def _run_shards(tmp_path, inputs, n, tokenizer, **kw):
    prefixes = []
    for k in range(n):
        s = preprocess(inputs, str(tmp_path / "out"), tokenizer, num_shards=n, shard_index=k, **kw)
        assert s.shard == [k, n]
        prefixes.append(s.sources[0].outputs[0].prefix)
    assert prefixes == sorted(prefixes)  # the names sort in shard order
    return prefixes


def test_three_shards_of_example_corpus_merge_to_the_single_run(tmp_path):
    src, docs = _example_corpus(tmp_path)
    preprocess([str(src)], str(tmp_path / "one"), EXAMPLES, append_eod=True)
    prefixes = _run_shards(tmp_path, [str(src)], 3, EXAMPLES, append_eod=True)
    assert prefixes[1] == f"{tmp_path}/out_shard1of3_text_document"
    counts = [IndexedDataset(p).document_count for p in prefixes]
    assert all(c > 0 for c in counts) and sum(counts) == len(docs)  # every line in exactly one shard
    s = preprocess([str(tmp_path / "out_shard?of3_text_document")], str(tmp_path / "merged"), None, merge_only=True)
    assert s.sources[0].files == prefixes
    assert files(tmp_path / "merged") == files(tmp_path / "one_text_document")
    assert files(tmp_path / "merged") == reference_write(None, EXAMPLES / "tokenizer.json", docs, "megatron", True)


@pytest.mark.parametrize("n", [2, 5, 12])
def test_many_files_gzip_and_empty_shards(tmp_path, tokenizer_file, n):
    write_jsonl(tmp_path / "a.jsonl", DOCS * 5)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in DOCS)
    write_jsonl(tmp_path / "c.jsonl", DOCS[:2])
    (tmp_path / "d.json").write_text(json.dumps(DOCS[3:5]))
    inputs = [str(tmp_path / p) for p in ("a.jsonl", "b.jsonl.gz", "c.jsonl", "d.json")]
    preprocess(inputs, str(tmp_path / "one"), tokenizer_file, compat="mindformers", append_eod=True)
    prefixes = _run_shards(tmp_path, inputs, n, tokenizer_file, compat="mindformers", append_eod=True)
    preprocess(prefixes, str(tmp_path / "merged"), None, merge_only=True)
    assert files(tmp_path / "merged") == files(tmp_path / "one_text_document")


def test_pieces_partition_the_lines(tmp_path):
    rng = random.Random(1)
    paths = []
    for i in range(4):
        lines = [b"x" * rng.choice([0, 1, 5, 40, 300]) for _ in range(rng.randint(0, 30))]
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        (tmp_path / f"{i}.jsonl").write_bytes(data)
        paths.append(tmp_path / f"{i}.jsonl")
    for n in (1, 2, 3, 7, 50):
        got = {p: b"" for p in paths}
        for k in range(n):
            for piece in shard_pieces(paths, n, k):
                data = piece.path.read_bytes()
                part = data[piece.start:piece.end]
                assert piece.start == 0 or data[piece.start - 1:piece.start] == b"\n"  # cut at line starts
                got[piece.path] += part
        assert all(got[p] == p.read_bytes() for p in paths), n  # every byte once, in order


def test_errors_in_a_shard_name_the_file_line(tmp_path, tokenizer_file):
    lines = [json.dumps({"text": f"line {i}"}) for i in range(200)]
    lines[150] = '{"text": broken'
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(lines) + "\n")
    preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, num_shards=2, shard_index=0)
    with pytest.raises(DataFormatError) as e:
        preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, num_shards=2, shard_index=1)
    assert e.value.message.startswith(f"{src}:151: ") and e.value.line == 151
    s = preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, num_shards=2, shard_index=1, on_error="skip")
    rejects = [json.loads(x) for x in open(s.sources[0].rejects_path)]
    assert rejects == [{"file": str(src), "line": 151, "reason": rejects[0]["reason"]}]


def test_shard_arguments(tmp_path, tokenizer_file):
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    for kw, msg in (({"num_shards": 3}, "go together"), ({"shard_index": 0}, "go together"),
                    ({"num_shards": 3, "shard_index": 3}, r"outside 0\.\.2"),
                    ({"num_shards": 0, "shard_index": 0}, "positive integer")):
        with pytest.raises(InputError, match=msg):
            preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, **kw)
    with pytest.raises(InputError, match="--num-shards is not available with --format mindrecord"):
        preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, num_shards=2, shard_index=0,
                   format="mindrecord", seq_length=8)
    with pytest.raises(InputError, match="no .idx file matches"):
        preprocess([str(tmp_path / "nothing_*")], str(tmp_path / "m"), None, merge_only=True)
    assert shard_name(12, 3) == "shard03of12" and shard_name(1, 0) == "shard0of1"


def test_cli_shard_prints_the_merge_command(tmp_path, tokenizer_file):
    src = write_jsonl(tmp_path / "c.jsonl", DOCS * 4)
    runner = CliRunner()
    for k in range(2):
        r = runner.invoke(app, ["preprocess", "-i", f"wiki={src}", "-o", str(tmp_path / "d"), "-t",
                                str(tokenizer_file), "--num-shards", "2", "--shard-index", str(k)],
                          terminal_width=250)
        assert r.exit_code == 0, r.output
    command = f"mftk preprocess --merge --input '{tmp_path}/d_wiki_shard?of2_text_document' --output-prefix " \
              f"'{tmp_path}/d_wiki_text_document'"
    assert "shard 1 of 2 (0-based) written" in r.stdout and command in r.stdout
    r = runner.invoke(app, ["preprocess", "--merge", "-i", f"{tmp_path}/d_wiki_shard?of2_text_document", "-o",
                            f"{tmp_path}/d_wiki_text_document"])
    assert r.exit_code == 0, r.output
    preprocess([f"wiki={src}"], str(tmp_path / "one"), tokenizer_file)
    assert files(tmp_path / "d_wiki_text_document") == files(tmp_path / "one_wiki_text_document")


def test_interrupted_shard_resumes_to_the_same_output(tmp_path, tokenizer_file):
    from tests.helpers.preprocess import Boom as _Boom

    paths = [str(write_jsonl(tmp_path / f"{i}.jsonl", DOCS * 3)) for i in range(4)]
    clean = preprocess(paths, str(tmp_path / "clean"), tokenizer_file, num_shards=2, shard_index=1, append_eod=True)
    state = tmp_path / "run_shard1of2.preprocess-state.json"
    for n in range(1, 60):
        try:
            preprocess(paths, str(tmp_path / "run"), tokenizer_file, num_shards=2, shard_index=1, append_eod=True,
                       batch_bytes=1, progress=_Boom(n))
        except KeyboardInterrupt:
            if state.exists():
                break
    assert state.exists()
    s = preprocess(paths, str(tmp_path / "run"), tokenizer_file, num_shards=2, shard_index=1, append_eod=True,
                   resume=True)
    assert s.sources[0].resumed_files >= 1
    assert files(s.sources[0].outputs[0].prefix) == files(clean.sources[0].outputs[0].prefix)
    assert not list(tmp_path.glob("*.partial")) and not state.exists()
