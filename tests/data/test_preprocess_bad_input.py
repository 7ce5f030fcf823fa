"""Every bad-input case of the issue: an error naming file, line and cause, or with
--on-error skip a listed reject and a completed run."""
from __future__ import annotations

import json
import os

import pytest

from mftk.data.indexed import IndexedDataset
from mftk.data.preprocess import preprocess
from mftk.errors import DataFormatError, InputError

GOOD = b'{"text": "a good line"}\n'

# (id, bad line bytes, words expected in the reason)
BAD_LINES = [
    ("blank", b"", "blank line"),
    ("whitespace", b"   \t ", "whitespace-only"),
    ("truncated", b'{"text": "abc', "truncated JSON"),
    ("trailing-garbage", b'{"text": "abc"} xyz', "trailing characters"),
    ("single-quotes", b"{'text': 'abc'}", "single quotes"),
    ("missing-key", b'{"body": "abc"}', "missing key 'text'"),
    ("null", b'{"text": null}', "'text' is null"),
    ("number", b'{"text": 3}', "'text' is number"),
    ("object", b'{"text": {"a": 1}}', "'text' is object"),
    ("list-of-non-strings", b'{"text": ["a", 1]}', "list containing a non-string"),
    ("top-level-array", b'["text"]', "JSON array"),
    ("top-level-string", b'"text"', "JSON string"),
    ("mid-file-bom", b'\xef\xbb\xbf{"text": "abc"}', "byte-order mark"),
    ("lone-surrogate", b'{"text": "abc \\ud800 def"}', "lone UTF-16 surrogate"),
    ("non-utf8", b'{"text": "caf\xe9"}', "not valid UTF-8"),
    ("non-utf8-in-a-key-not-read", b'{"text": "ok", "meta": "caf\xe9"}', "not valid UTF-8"),
    ("utf8-encoded-surrogate", b'{"text": "a\xed\xa0\x80b"}', "not valid UTF-8"),
    ("raw-cr-in-string", b'{"text": "abc\rdef"}', "raw carriage return"),
]


@pytest.mark.parametrize("name,bad,reason", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_fails_with_file_line_and_cause(tmp_path, tokenizer_file, name, bad, reason):
    src = tmp_path / "in.jsonl"
    src.write_bytes(GOOD + bad + b"\n" + GOOD)
    with pytest.raises(DataFormatError) as e:
        preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, append_eod=True)
    assert e.value.message.startswith(f"{src}:2: ")
    assert reason in e.value.message
    assert e.value.line == 2 and e.value.path == str(src)
    assert "--on-error skip" in e.value.hint
    assert not list(tmp_path.glob("out*"))  # nothing half-written left behind


@pytest.mark.parametrize("name,bad,reason", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_skipped_and_listed(tmp_path, tokenizer_file, name, bad, reason):
    src = tmp_path / "in.jsonl"
    src.write_bytes(GOOD + bad + b"\n" + GOOD)
    s = preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, append_eod=True, on_error="skip")
    assert s.sources[0].rejected == 1 and s.sources[0].documents == 2
    rejects = [json.loads(x) for x in open(tmp_path / "out.rejects.jsonl", encoding="utf-8")]
    assert len(rejects) == 1
    assert rejects[0]["line"] == 2 and rejects[0]["file"] == str(src) and reason in rejects[0]["reason"]
    assert len(IndexedDataset(tmp_path / "out_text_document")) == 2


def test_max_errors(tmp_path, tokenizer_file):
    src = tmp_path / "in.jsonl"
    src.write_bytes(GOOD + b"x\n" * 3 + GOOD)
    with pytest.raises(DataFormatError, match="more than 2 bad lines"):
        preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, on_error="skip", max_errors=2)
    s = preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, on_error="skip", max_errors=3)
    assert s.sources[0].rejected == 3


@pytest.mark.parametrize("variant", [
    b'\xef\xbb\xbf{"text": "a good line"}\n{"text": "two"}\n',     # BOM at file start: accepted
    b'{"text": "a good line"}\r\n{"text": "two"}\r\n',              # CRLF line ends: accepted
    b'{"text":\r"a good line"}\n{"text": "two"}',                    # raw \r between tokens, no final \n
])
def test_accepted_variants_equal_plain_lf(tmp_path, tokenizer_file, variant):
    (tmp_path / "plain.jsonl").write_bytes(b'{"text": "a good line"}\n{"text": "two"}\n')
    (tmp_path / "v.jsonl").write_bytes(variant)
    preprocess([str(tmp_path / "plain.jsonl")], str(tmp_path / "p"), tokenizer_file, append_eod=True)
    preprocess([str(tmp_path / "v.jsonl")], str(tmp_path / "v"), tokenizer_file, append_eod=True)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"p_text_document.{ext}").read_bytes() == (tmp_path / f"v_text_document.{ext}").read_bytes()


def test_literal_special_token_is_encoded_as_special(tmp_path, tokenizer_file):
    (tmp_path / "s.jsonl").write_text('{"text": "a<|endoftext|>b"}\n')
    s = preprocess([str(tmp_path / "s.jsonl")], str(tmp_path / "s"), tokenizer_file, append_eod=True)
    tokens = IndexedDataset(tmp_path / "s_text_document").get(0).tolist()
    assert tokens.count(0) == 2  # one from the text, one appended
    assert s.sources[0].special_tokens_in_text == 1


def test_empty_file(tmp_path, tokenizer_file):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "good.jsonl").write_bytes(GOOD)
    with pytest.raises(DataFormatError, match="empty file"):
        preprocess([str(tmp_path / "empty.jsonl")], str(tmp_path / "o"), tokenizer_file)
    s = preprocess([str(tmp_path / "empty.jsonl"), str(tmp_path / "good.jsonl")], str(tmp_path / "o"),
                   tokenizer_file, on_error="skip")
    assert s.sources[0].rejected == 1
    with pytest.raises(DataFormatError, match="no tokens to write"):
        preprocess([str(tmp_path / "empty.jsonl")], str(tmp_path / "o2"), tokenizer_file, on_error="skip")


def test_missing_inputs(tmp_path, tokenizer_file):
    with pytest.raises(InputError, match="no such input file"):
        preprocess([str(tmp_path / "nope.jsonl")], str(tmp_path / "o"), tokenizer_file)
    with pytest.raises(InputError, match="no file matches"):
        preprocess([str(tmp_path / "*.jsonl")], str(tmp_path / "o"), tokenizer_file)


def test_unwritable_output(tmp_path, tokenizer_file):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="cannot write output"):
        preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "afile" / "sub" / "o"), tokenizer_file)
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(InputError, match="cannot write output"):
                preprocess([str(tmp_path / "in.jsonl")], str(ro / "o"), tokenizer_file)
        finally:
            ro.chmod(0o700)


def test_tokenizer_missing_or_invalid(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    with pytest.raises(InputError, match="no such tokenizer"):
        preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(DataFormatError, match="not a Hugging Face tokenizer"):
        preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tmp_path / "bad.json")
    with pytest.raises(InputError, match="no such tokenizer"):
        preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tmp_path)  # directory without one


def test_eod_token_resolution(tmp_path, tokenizer_file):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    with pytest.raises(InputError, match="no token '<eos>'"):
        preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tokenizer_file, eod_token="<eos>")
    s = preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tokenizer_file, eod_token="a",
                   append_eod=True)
    assert s.eod_token == "a" and s.eod_id == IndexedDataset(tmp_path / "o_text_document").get(0)[-1]


def test_broken_json_array_file(tmp_path, tokenizer_file):
    (tmp_path / "a.json").write_text('[\n {"text": "a"},\n {"text": "b"\n]')
    with pytest.raises(DataFormatError, match=r"a.json:4"):
        preprocess([str(tmp_path / "a.json")], str(tmp_path / "o"), tokenizer_file)
    (tmp_path / "b.json").write_text('[\n {"text": "a"},\n {"text": 5}\n]')
    with pytest.raises(DataFormatError, match=r"b.json:3: 'text' is number"):
        preprocess([str(tmp_path / "b.json")], str(tmp_path / "o"), tokenizer_file)


def test_corrupt_gzip(tmp_path, tokenizer_file):
    import gzip

    data = gzip.compress(GOOD * 1000)
    (tmp_path / "c.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match="truncated or corrupt|cannot read compressed"):
        preprocess([str(tmp_path / "c.jsonl.gz")], str(tmp_path / "o"), tokenizer_file)


@pytest.mark.parametrize("batch_bytes", [1, 64, 1 << 20])
def test_utf8_checked_whichever_parse_path_a_chunk_takes(tmp_path, tokenizer_file, batch_bytes):
    """Lines with only the text key, then lines with other keys (valid and not): same outcome per line."""
    lines = [b'{"text": "caf\xc3\xa9 %d"}' % i for i in range(5)]
    lines += [b'{"text": "x %d", "meta": "\xc3\xa9"}' % i for i in range(5)]
    lines.insert(7, b'{"text": "bad", "meta": "caf\xe9"}')
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    s = preprocess([str(src)], str(tmp_path / "out"), tokenizer_file, on_error="skip", batch_bytes=batch_bytes)
    rejects = [json.loads(x) for x in open(tmp_path / "out.rejects.jsonl", encoding="utf-8")]
    assert [(r["line"], "not valid UTF-8" in r["reason"]) for r in rejects] == [(8, True)]
    assert s.sources[0].documents == 10


@pytest.mark.parametrize("backend", ["gigatoken", "hf"])
def test_text_the_tokenizer_cannot_encode_is_rejected_with_its_line(tmp_path, tokenizer_file, monkeypatch, backend):
    """A chunk the tokenizer fails on is encoded document by document: the documents it cannot encode are
    rejects (file:line and the tokenizer's message); the others are written as if those lines were not
    there."""
    from mftk.data import tokenize
    from tests.helpers.preprocess import files, reference_write, write_jsonl

    cls = tokenize.GigatokenEncoder if backend == "gigatoken" else tokenize.HFEncoder
    real = cls.encode

    def refuses_marker(self, texts):
        if any("unencodable-marker" in t for t in texts):
            raise RuntimeError("the tokenizer refuses this")
        return real(self, texts)

    monkeypatch.setattr(cls, "encode", refuses_marker)
    # the backend check must not sample the marker line (gigatoken failing on a check text rules it out)
    from mftk.data import hf_reference
    from mftk.data import preprocess as run_module

    monkeypatch.setattr(hf_reference.Reference, "check", lambda self: None)
    monkeypatch.setattr(run_module, "check_sample", lambda paths, keys: [])
    good = [{"text": f"document number {i} of the corpus"} for i in range(40)]
    docs = good[:17] + [{"text": "an unencodable-marker line"}] + good[17:]
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    s = preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, append_eod=True, on_error="skip",
                   tokenizer_backend=backend, batch_bytes=256)
    assert s.backend == backend and s.sources[0].rejected == 1
    reject = json.loads((tmp_path / "o.rejects.jsonl").read_text())
    assert reject["line"] == 18
    assert "the tokenizer cannot encode this text (the tokenizer refuses this)" in reject["reason"]
    assert files(tmp_path / "o_text_document") == reference_write(None, tokenizer_file, good, "megatron", True)
    with pytest.raises(DataFormatError, match=r"c\.jsonl:18: the tokenizer cannot encode this text"):
        preprocess([str(src)], str(tmp_path / "f"), tokenizer_file, tokenizer_backend=backend)
    assert not list(tmp_path.glob("f_*"))
