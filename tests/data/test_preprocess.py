"""Preprocessing against an independent, literal port of the reference scripts, plus every bad input."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder
from mftk.data.pipeline import assemble
from mftk.data.preprocess import preprocess
from mftk.errors import DataFormatError, InputError
from tests.helpers.data import read_pair
from tests.helpers.preprocess import DOCS, Boom as _Boom, files, reference_write, write_jsonl


@pytest.mark.parametrize("compat", ["megatron", "mindformers"])
@pytest.mark.parametrize("append_eod", [True, False])
@pytest.mark.parametrize("batch_bytes", [1, 1 << 20])
def test_byte_identical_to_reference(tmp_path, tokenizer_file, compat, append_eod, batch_bytes):
    src = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    s = preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, compat=compat, append_eod=append_eod,
                   batch_bytes=batch_bytes)
    assert files(tmp_path / "out_text_document") == reference_write(
        tmp_path / "ref", tokenizer_file, DOCS * 3, compat, append_eod)
    src_summary = s.sources[0]
    assert src_summary.documents == 21
    assert src_summary.empty_documents == 9  # "", [], ["", ""] three times
    assert src_summary.special_tokens_in_text == 3
    assert s.eod_id == 0 and s.eod_token == "<|endoftext|>"
    assert s.dtype == ("uint16" if compat == "megatron" else "int32")


def test_tv_pre_vectors(tmp_path):
    # megatron-data.md §7 TV-PRE: token lists [5,6,7], [8], [] with --append-eod and eod = 2.
    flat, lengths, per_doc = np.array([5, 6, 7, 8]), np.array([3, 1, 0], np.int32), np.array([1, 1, 1])
    for compat, dtype in (("mindformers", np.int32), ("megatron", np.uint16)):
        toks, seq, docs, empty = assemble(flat, lengths, per_doc, 2, True, compat == "mindformers")
        with IndexedDatasetBuilder(tmp_path / compat, dtype) as b:
            b.add_batch(toks, seq, docs)
            b.finalize()
        assert empty == 1
    idx, bin_ = files(tmp_path / "mindformers")
    assert len(idx) == 102 and bin_.hex() == "050000000600000007000000020000000800000002000000"
    ds = IndexedDataset(tmp_path / "mindformers")
    assert ds.sequence_lengths.tolist() == [4, 2, 0] and ds.sequence_pointers.tolist() == [0, 16, 24]
    assert ds.document_indices.tolist() == [0, 1, 2, 3]
    idx, bin_ = files(tmp_path / "megatron")
    assert len(idx) == 90 and bin_.hex() == "050006000700020008000200"
    assert read_pair(tmp_path / "megatron")[2] == [0, 1, 2, 2]


def test_gzip_json_array_globs_and_keys(tmp_path, tokenizer_file):
    docs = [{"text": f"doc {i} fox", "title": f"title {i}"} for i in range(6)]
    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs[:2])
    (tmp_path / "b.json").write_text(json.dumps(docs[2:4], indent=2))
    write_jsonl(tmp_path / "c.jsonl", docs[4:])
    s = preprocess([str(tmp_path / "a.jsonl.gz"), str(tmp_path / "[bc].json*")], str(tmp_path / "o"),
                   tokenizer_file, json_keys=["text", "title"], append_eod=True)
    for key in ("text", "title"):
        want = reference_write(None, tokenizer_file, [{"text": d[key]} for d in docs], "megatron", True)
        assert files(tmp_path / f"o_{key}_document") == want
    assert [o.key for o in s.sources[0].outputs] == ["text", "title"]


def test_multi_source_weights_and_block(tmp_path, tokenizer_file):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:1] * 3)
    write_jsonl(tmp_path / "b.jsonl", DOCS[:1])
    s = preprocess([f"wiki={tmp_path / 'a.jsonl'}", f"code={tmp_path / 'b.jsonl'}"], str(tmp_path / "mix"),
                   tokenizer_file, append_eod=True)
    assert [x.prefix for x in s.sources] == [str(tmp_path / "mix_wiki"), str(tmp_path / "mix_code")]
    assert s.weights == pytest.approx([0.75, 0.25])
    assert s.data_path_block().splitlines() == [
        "data_path:", "  - '0.75'", f"  - '{tmp_path}/mix_wiki_text_document'",
        "  - '0.25'", f"  - '{tmp_path}/mix_code_text_document'"]
    s = preprocess([f"wiki={tmp_path / 'a.jsonl'}", f"code={tmp_path / 'b.jsonl'}"], str(tmp_path / "mix"),
                   tokenizer_file, weights=[0.3, 0.7])
    assert s.weights == [0.3, 0.7]
    with pytest.raises(InputError, match="2 weights for 1"):
        preprocess([str(tmp_path / "a.jsonl")], str(tmp_path / "x"), tokenizer_file, weights=[1, 2])
    with pytest.raises(InputError, match="mixing"):
        preprocess([f"wiki={tmp_path / 'a.jsonl'}", str(tmp_path / "b.jsonl")], str(tmp_path / "x"), tokenizer_file)


def test_merge_equals_single_run(tmp_path, tokenizer_file):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    write_jsonl(tmp_path / "b.jsonl", DOCS[3:])
    for name in ("a", "b"):
        preprocess([str(tmp_path / f"{name}.jsonl")], str(tmp_path / name), tokenizer_file, append_eod=True)
    preprocess([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], str(tmp_path / "ab"), tokenizer_file,
               append_eod=True)
    s = preprocess([str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document.bin")],
                   str(tmp_path / "m_text_document"), None, merge_only=True)
    assert files(tmp_path / "m_text_document") == files(tmp_path / "ab_text_document")
    assert s.sources[0].outputs[0].documents == len(DOCS)


def test_interrupt_leaves_no_valid_pair_and_resume_completes(tmp_path, tokenizer_file):
    paths = [str(write_jsonl(tmp_path / f"{i}.jsonl", DOCS)) for i in range(3)]
    preprocess(paths, str(tmp_path / "clean"), tokenizer_file, append_eod=True)
    interrupted = None
    for n in range(1, 40):
        try:
            preprocess(paths, str(tmp_path / "run"), tokenizer_file, append_eod=True, batch_bytes=1,
                       progress=_Boom(n))
        except KeyboardInterrupt:
            assert not (tmp_path / "run_text_document.bin").exists()
            assert not (tmp_path / "run_text_document.idx").exists()
            state = tmp_path / "run.preprocess-state.json"
            if state.exists() and interrupted is None:
                interrupted = n
                break
    assert interrupted is not None
    s = preprocess(paths, str(tmp_path / "run"), tokenizer_file, append_eod=True, resume=True)
    assert s.sources[0].resumed_files >= 1
    assert s.sources[0].documents == 3 * len(DOCS)
    assert files(tmp_path / "run_text_document") == files(tmp_path / "clean_text_document")
    assert not (tmp_path / "run.preprocess-state.json").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_resume_after_bad_line_fixed(tmp_path, tokenizer_file):
    a = write_jsonl(tmp_path / "a.jsonl", DOCS)
    b = tmp_path / "b.jsonl"
    b.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(DataFormatError) as e:
        preprocess([str(a), str(b)], str(tmp_path / "r"), tokenizer_file, append_eod=True)
    assert "--resume" in e.value.hint
    write_jsonl(b, [{"text": "fine"}, {"text": "fixed"}])
    s = preprocess([str(a), str(b)], str(tmp_path / "r"), tokenizer_file, append_eod=True, resume=True)
    assert s.sources[0].resumed_files == 1
    want = reference_write(None, tokenizer_file, DOCS + [{"text": "fine"}, {"text": "fixed"}], "megatron", True)
    assert files(tmp_path / "r_text_document") == want
    # a resume with other settings is refused rather than mixing outputs
    b.write_text('{"text": broken\n')
    with pytest.raises(DataFormatError):
        preprocess([str(a), str(b)], str(tmp_path / "r2"), tokenizer_file)
    with pytest.raises(InputError, match="different inputs or settings"):
        preprocess([str(a), str(b)], str(tmp_path / "r2"), tokenizer_file, append_eod=True, resume=True)


def test_long_single_line_document(tmp_path, tokenizer_file):
    text = "the quick brown fox " * (3 * 1024 * 1024 // 20)
    src = write_jsonl(tmp_path / "big.jsonl", [{"text": text}, {"text": "after"}])
    s = preprocess([str(src)], str(tmp_path / "big"), tokenizer_file, append_eod=True)
    ds = IndexedDataset(tmp_path / "big_text_document")
    assert len(ds) == 2 and ds.get(1).tolist()[-1] == 0
    assert s.sources[0].tokens == int(ds.sequence_lengths.sum())


def test_thread_switch_interval_is_shortened_only_while_a_group_runs(tmp_path, tokenizer_file, monkeypatch):
    """The parse thread hands the GIL to the encoder thread quickly during the run; the process's setting is
    restored afterwards, also when the run fails."""
    import sys

    from mftk.data import pipeline

    seen = []
    real = pipeline.SourceRun._piece
    monkeypatch.setattr(pipeline.SourceRun, "_piece", lambda self, *a: (seen.append(sys.getswitchinterval()),
                                                                         real(self, *a))[1])
    before = sys.getswitchinterval()
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, append_eod=True)
    assert seen == [pipeline.SWITCH_INTERVAL] != [before] and sys.getswitchinterval() == before
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    with pytest.raises(DataFormatError):
        preprocess([str(bad)], str(tmp_path / "p"), tokenizer_file)
    assert sys.getswitchinterval() == before


def test_chunks_hold_enough_lines_and_start_small(tmp_path):
    """The reader's chunks: the first read is small (the encoder starts sooner); a chunk of short reads holds at
    least MIN_LINES lines, gathering at most MAX_GATHER reads; every line arrives once, in order, whole."""
    from mftk.data import jsonl

    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": "w" * (i % 7) * 40}) + "\n" for i in range(300)]  # 12-254 bytes a line
    path.write_text("".join(lines))
    reader = jsonl.CorpusReader(path, ["text"], chunk_bytes=300)
    chunks = list(reader)
    reader.close()
    assert [t for c in chunks for t in c.texts[0]] == [json.loads(line)["text"] for line in lines]
    counts = [c.lines for c in chunks]
    gathered_cap = jsonl.MAX_GATHER * 300 // max(len(line) for line in lines)  # lines that MAX_GATHER reads hold at least
    assert all(n >= min(jsonl.MIN_LINES, gathered_cap) for n in counts[:-1]), counts
    assert max(counts) <= jsonl.MAX_GATHER * 300 // min(len(line) for line in lines) + 1, counts
    assert jsonl.FIRST_CHUNK_BYTES < jsonl.CHUNK_BYTES
    path.write_text("".join(lines * 200))  # ~2.6 MB
    big = jsonl.CorpusReader(path, ["text"])  # default sizes: the first chunk is cut at FIRST_CHUNK_BYTES
    first = next(iter(big))
    big.close()
    assert first.lines < len(lines) * 200 and sum(len(line) for line in (lines * 200)[:first.lines]) <= jsonl.FIRST_CHUNK_BYTES
