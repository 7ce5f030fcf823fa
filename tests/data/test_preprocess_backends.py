"""Tokenizer backends: gigatoken only where it reproduces HF tokenizers, checked against the literal port."""
from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from typer.testing import CliRunner

from commands.app import app
from mftk.data import jsonl, tokenize
from mftk.data.preprocess import preprocess
from mftk.errors import InputError
from tests.helpers.preprocess import DOCS, EXAMPLES, example_corpus as _example_corpus, files, reference_write, write_jsonl


def _variant(tmp_path, name, change) -> Path:
    tok = Tokenizer.from_file(str(EXAMPLES / "tokenizer.json"))
    change(tok)
    path = tmp_path / name / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def _edge_docs(seed=0, n=60):
    """Documents from every edge case, glued and cut at random, plus random Unicode soup."""
    rng = random.Random(seed)
    pieces = [text for _, text in tokenize.EDGE_CASES] + ["<|endoftext|>", "word", " ", "\n"]
    docs = [{"text": text} for _, text in tokenize.EDGE_CASES]
    for _ in range(n):
        text = "".join(rng.choice(pieces)[: rng.randint(0, 50)] for _ in range(rng.randint(0, 8)))
        text += "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0x2FFF), rng.randint(0x1F300, 0x1F6FF)]))
                        for _ in range(rng.randint(0, 30)))
        docs.append({"text": text} if rng.random() < 0.8 else {"text": [text, "", text[::-1]]})
    return docs


@pytest.mark.parametrize("compat", ["megatron", "mindformers"])
def test_example_data_identical_under_both_backends_and_reference(tmp_path, compat):
    src, docs = _example_corpus(tmp_path)
    want = reference_write(None, EXAMPLES / "tokenizer.json", docs, compat, True)
    for backend in ("gigatoken", "hf"):
        s = preprocess([str(src)], str(tmp_path / backend), EXAMPLES, append_eod=True, compat=compat,
                       tokenizer_backend=backend)
        assert s.backend == backend
        assert files(tmp_path / f"{backend}_text_document") == want
    assert "checked equal" in preprocess([str(src)], str(tmp_path / "auto"), EXAMPLES, append_eod=True,
                                         compat=compat).backend_note


@pytest.mark.parametrize("compat", ["megatron", "mindformers"])
@pytest.mark.parametrize("append_eod", [True, False])
def test_generated_edge_cases_identical(tmp_path, tokenizer_file, compat, append_eod):
    docs = _edge_docs() + DOCS
    src = write_jsonl(tmp_path / "edge.jsonl", docs)
    want = reference_write(None, tokenizer_file, docs, compat, append_eod)
    for backend in ("gigatoken", "hf"):
        s = preprocess([str(src)], str(tmp_path / backend), tokenizer_file, append_eod=append_eod, compat=compat,
                       tokenizer_backend=backend, batch_bytes=4096)
        assert s.backend == backend and files(tmp_path / f"{backend}_text_document") == want


def test_post_processor_special_tokens_are_added(tmp_path):
    """A BOS/EOS template (DeepSeek, Llama 3 style) is applied around every text, as HF does."""
    tok = _variant(tmp_path, "bos", lambda t: setattr(t, "post_processor", processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|endoftext|> $A <|endoftext|>",
                                      special_tokens=[("<|endoftext|>", 0)])])))
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    s = preprocess([str(src)], str(tmp_path / "o"), tok, append_eod=True)
    assert s.backend == "gigatoken"
    assert files(tmp_path / "o_text_document") == reference_write(None, tok, DOCS, "megatron", True)


@pytest.mark.parametrize("name,change,reason", [
    ("nfkc", lambda t: setattr(t, "normalizer", normalizers.NFKC()), "gigatoken cannot load it (Unsupported normalizer"),
    ("noregex", lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                               use_regex=False)), "ids differ from HF"),
    ("truncation", lambda t: t.enable_truncation(8), "enables truncation or padding"),
])
def test_fallback_to_hf_when_gigatoken_cannot_reproduce(tmp_path, name, change, reason):
    tok = _variant(tmp_path, name, change)
    src = write_jsonl(tmp_path / "c.jsonl", DOCS * 2)
    s = preprocess([str(src)], str(tmp_path / "o"), tok, append_eod=True)
    assert s.backend == "hf" and s.backend_note.startswith("gigatoken not used: ") and reason in s.backend_note
    assert files(tmp_path / "o_text_document") == reference_write(None, tok, DOCS * 2, "megatron", True)
    with pytest.raises(InputError, match="--tokenizer-backend gigatoken cannot be used") as e:
        preprocess([str(src)], str(tmp_path / "g"), tok, tokenizer_backend="gigatoken")
    assert reason in e.value.message and "auto" in e.value.hint
    assert not list(tmp_path.glob("g*"))


def test_a_difference_on_the_input_sample_alone_is_caught(tmp_path, tokenizer_file, monkeypatch):
    """The check encodes real input: a text only the input holds decides the backend."""
    real = tokenize.GigatokenEncoder.encode_lists

    def wrong_on_marker(self, texts):
        out = real(self, texts)
        return [ids[:-1] if "zebra-marker" in t else ids for t, ids in zip(texts, out)]

    monkeypatch.setattr(tokenize.GigatokenEncoder, "encode_lists", wrong_on_marker)
    src = write_jsonl(tmp_path / "c.jsonl", DOCS + [{"text": "a zebra-marker line"}])
    s = preprocess([str(src)], str(tmp_path / "o"), tokenizer_file)
    assert s.backend == "hf" and re.search(r"on input text \d+ of the sample 'a zebra-marker line'", s.backend_note)


def test_a_late_verdict_discards_what_gigatoken_wrote(tmp_path, tokenizer_file, monkeypatch):
    """The id comparison finishes while the run has started: when it fails, nothing gigatoken encoded is kept
    (no progress record, no output); the run starts over with HF and writes exactly the reference files."""
    real = tokenize.GigatokenEncoder.encode
    seen = []

    def wrong_on_marker(self, texts):
        flat, lengths = real(self, texts)
        seen.append(len(texts))
        if any("zebra-marker" in t for t in texts):
            flat = flat.copy()
            flat[0] = (int(flat[0]) + 1) % 100
        return flat, lengths

    monkeypatch.setattr(tokenize.GigatokenEncoder, "encode", wrong_on_marker)
    real_confirm = tokenize.BackendCheck.confirm
    states = []

    def confirm(self):
        states.append(list(tmp_path.glob("o*.preprocess-state.json")))
        return real_confirm(self)

    monkeypatch.setattr(tokenize.BackendCheck, "confirm", confirm)
    monkeypatch.setattr(jsonl, "MIN_LINES", 1)  # chunks of a few lines: many encoded before the verdict
    docs = DOCS * 3 + [{"text": "a zebra-marker line"}]
    srcs = [write_jsonl(tmp_path / f"c{i}.jsonl", docs) for i in range(3)]
    s = preprocess([str(p) for p in srcs], str(tmp_path / "o"), tokenizer_file, append_eod=True, batch_bytes=256)
    assert s.backend == "hf" and s.backend_note.startswith("gigatoken not used: its ids differ from HF tokenizers")
    assert len(seen) > len(srcs) and states and states[0] == []  # data was encoded before the verdict, no record yet
    assert files(tmp_path / "o_text_document") == reference_write(None, tokenizer_file, docs * 3, "megatron", True)
    assert not list(tmp_path.glob("o*.preprocess-state.json*"))
    with pytest.raises(InputError, match="--tokenizer-backend gigatoken cannot be used: its ids differ"):
        preprocess([str(p) for p in srcs], str(tmp_path / "g"), tokenizer_file, tokenizer_backend="gigatoken",
                   batch_bytes=256)
    assert not list(tmp_path.glob("g*"))


def test_gigatoken_missing_falls_back(tmp_path, tokenizer_file, monkeypatch):
    """As without the package: not importable, not found by the import system (whether it was imported
    before in this test process or not)."""
    import builtins
    import importlib.util
    import sys

    from mftk.data import gigatoken_ids

    real_import, real_find = builtins.__import__, importlib.util.find_spec

    def no_gigatoken(name, *args, **kwargs):
        if name == "gigatoken" or name.startswith("gigatoken."):
            raise ImportError("No module named 'gigatoken'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gigatoken)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gigatoken" else real_find(name, *a))
    monkeypatch.delitem(sys.modules, "gigatoken", raising=False)
    monkeypatch.setattr(gigatoken_ids, "_rust", [])
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    s = preprocess([str(src)], str(tmp_path / "o"), tokenizer_file)
    assert s.backend == "hf" and "not installed" in s.backend_note


def test_unknown_backend_is_refused(tmp_path, tokenizer_file):
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    with pytest.raises(InputError, match="--tokenizer-backend must be one of auto, gigatoken, hf"):
        preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, tokenizer_backend="fast")


def test_sample_spreads_over_files_and_skips_bad_lines(tmp_path):
    from mftk.data.inputs import sample_texts

    a = write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(100)])
    b = tmp_path / "b.jsonl"
    b.write_bytes(b"".join(b'{"text": "b%d"}\nnot json\n' % i for i in range(100)))
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": [f"c{i}", "x" * 5000]}) + "\n" for i in range(50))
    texts = sample_texts([a, b, tmp_path / "c.jsonl.gz"], ["text"], count=30, max_chars=100)
    assert {t[0] for t in texts} == {"a", "b", "c", "x"} and max(map(len, texts)) == 100
    assert len({t for t in texts if t.startswith("a")}) > 5  # spread, not the first line again and again


def test_sample_request_names_every_file_of_every_group(tmp_path):
    """What the HF helper samples from: the files of all groups, globs expanded as the run expands them;
    nothing where the inputs do not name files (the run then says what is wrong)."""
    from mftk.data.inputs import sample_request

    for name in ("a1.jsonl", "a2.jsonl", "b.jsonl"):
        write_jsonl(tmp_path / name, DOCS)
    got = sample_request([f"wiki={tmp_path}/a*.jsonl", f"code={tmp_path}/b.jsonl"], ["text", "title"])
    assert got == {"paths": [str(tmp_path / n) for n in ("a1.jsonl", "a2.jsonl", "b.jsonl")], "keys": ["text", "title"]}
    assert sample_request([str(tmp_path / "b.jsonl")], None)["keys"] == ["text"]
    assert sample_request([str(tmp_path / "missing.jsonl")], None) is None
    assert sample_request([f"w={tmp_path}/b.jsonl", str(tmp_path / "a1.jsonl")], None) is None  # mixed groups
    assert sample_request(None, None) is None


def test_cli_summary_names_backend_and_fallback(tmp_path):
    tok = _variant(tmp_path, "nfkc", lambda t: setattr(t, "normalizer", normalizers.NFKC()))
    shutil.copy(EXAMPLES / "tokenizer_config.json", tok.parent)
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    runner = CliRunner()
    r = runner.invoke(app, ["preprocess", "-i", str(src), "-o", str(tmp_path / "o"), "-t", str(tok.parent)],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "tokenizer backend hf" in r.stdout and "gigatoken not used: gigatoken cannot load it" in r.stdout
    r = runner.invoke(app, ["preprocess", "-i", str(src), "-o", str(tmp_path / "p"), "-t", str(EXAMPLES),
                            "--json"])
    data = json.loads(r.stdout)
    assert data["backend"] == "gigatoken" and "checked equal" in data["backend_note"]
    r = runner.invoke(app, ["preprocess", "-i", str(src), "-o", str(tmp_path / "q"), "-t", str(tok.parent),
                            "--tokenizer-backend", "gigatoken"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "cannot be used" in " ".join(r.stderr.split())


def _growing_rss(monkeypatch) -> None:
    """The process seems to grow 1 MiB at every look (the real RSS may shrink after a reload)."""
    sizes = iter(range(1 << 20, 1 << 40, 1 << 20))
    monkeypatch.setattr(tokenize, "_rss", lambda: next(sizes))


def test_gigatoken_reload_drops_its_memo_and_changes_no_id(tokenizer_file, monkeypatch):
    from tokenizers import Tokenizer as HF

    _growing_rss(monkeypatch)
    texts = [d["text"] for d in _edge_docs(seed=3) if isinstance(d["text"], str)]
    encoder = tokenize.GigatokenEncoder(tokenizer_file.read_bytes(), [], [], memo_budget=0,
                                        check_every=0)  # reload every call
    want = [e.ids for e in HF.from_file(str(tokenizer_file)).encode_batch(texts)]
    for _ in range(3):
        assert encoder.encode_lists(texts) == want
    assert encoder.reloads == 3


def test_gigatoken_memo_is_checked_every_so_many_ids(tokenizer_file, monkeypatch):
    """The RSS is looked at once per ``check_every`` ids encoded, not at every batch."""
    _growing_rss(monkeypatch)
    texts = ["one two three four five six seven eight nine ten"] * 4
    encoder = tokenize.GigatokenEncoder(tokenizer_file.read_bytes(), [], [], memo_budget=0, check_every=10 ** 9)
    for _ in range(5):
        encoder.encode_lists(texts)
    assert encoder.reloads == 0
    per_batch = len(encoder.encode(texts)[0])
    encoder.check_every = 3 * per_batch  # a look after every third batch
    encoder._unchecked = 0
    for _ in range(7):
        encoder.encode(texts)
    assert encoder.reloads == 2


def test_helper_process_facts_equal_the_hf_tokenizer_own(tmp_path):
    """The helper process (off the run's GIL) reports what the HF tokenizer itself says; so does the run."""
    from mftk.data.hf_reference import start_reference
    from mftk.data.tokenize import load_tokenizer

    tok = _variant(tmp_path, "bos", lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])))
    from mftk.data.hf_reference import check_cases
    from mftk.data.inputs import check_sample

    hf = Tokenizer.from_file(str(tok))
    corpus = write_jsonl(tmp_path / "sample.jsonl", DOCS + [{"text": "東京 😀 <|endoftext|>x"}])
    ref = start_reference(tok, None, {"paths": [str(corpus)], "keys": ["text"]})
    facts = ref.facts()
    assert facts["vocab_size"] == hf.get_vocab_size(with_added_tokens=True)
    assert (facts["eod_token"], facts["eod_id"]) == ("<|endoftext|>", hf.token_to_id("<|endoftext|>"))
    assert facts["wrap"] == [[hf.token_to_id("<|endoftext|>")], []] and not facts["truncation_or_padding"]
    cases, ids = ref.check()  # the helper sampled the input itself: the texts the run would sample
    assert cases == check_cases(facts["added_cases"], check_sample([corpus], ["text"]))
    assert any(text == "東京 😀 <|endoftext|>x" for _, text in cases)
    assert ids == [e.ids for e in hf.encode_batch([text for _, text in cases])]
    assert ref.proc is None and ref.check() is None  # collected; once only
    assert start_reference(tok, None).check() is None  # no inputs named: facts only
    assert start_reference(tmp_path / "missing.json", None) is None
    ref = start_reference(tok, "<|not-a-token|>")
    assert ref.facts() is None and ref.proc is None  # the run then loads it itself and says what is wrong
    with pytest.raises(InputError, match="has no token '<|not-a-token|>'"):
        preprocess([str(write_jsonl(tmp_path / "c.jsonl", DOCS))], str(tmp_path / "o"), tok,
                   eod_token="<|not-a-token|>")
    loaded = load_tokenizer(tok)
    assert (loaded.vocab_size, loaded.eod_id) == (facts["vocab_size"], facts["eod_id"])


def test_without_the_helper_the_check_runs_here(tmp_path, tokenizer_file, monkeypatch):
    """A helper that cannot start, or gives no ids, changes nothing but where HF runs."""
    from mftk.data import hf_reference

    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    want = reference_write(None, tokenizer_file, DOCS, "megatron", True)
    monkeypatch.setattr(hf_reference.Reference, "check", lambda self: None)
    s = preprocess([str(src)], str(tmp_path / "a"), tokenizer_file, append_eod=True)
    assert s.backend == "gigatoken" and "checked equal" in s.backend_note
    assert files(tmp_path / "a_text_document") == want
    monkeypatch.setattr(hf_reference, "_PROGRAM", "import sys; sys.exit(3)")
    s = preprocess([str(src)], str(tmp_path / "b"), tokenizer_file, append_eod=True)
    assert s.backend == "gigatoken" and "checked equal" in s.backend_note
    assert files(tmp_path / "b_text_document") == want


def test_gigatoken_failing_on_a_check_text_falls_back(tmp_path, tokenizer_file, monkeypatch):
    """The check texts are encoded beside the run: a gigatoken that raises on one is not used, nothing it
    wrote is kept, and an explicit --tokenizer-backend gigatoken is refused."""
    def fails(self, texts):
        raise RuntimeError("boom on a check text")

    monkeypatch.setattr(tokenize.GigatokenEncoder, "encode_lists", fails)
    src = write_jsonl(tmp_path / "c.jsonl", DOCS)
    s = preprocess([str(src)], str(tmp_path / "o"), tokenizer_file, append_eod=True)
    assert s.backend == "hf" and "gigatoken fails on the check texts (boom on a check text)" in s.backend_note
    assert files(tmp_path / "o_text_document") == reference_write(None, tokenizer_file, DOCS, "megatron", True)
    with pytest.raises(InputError, match="gigatoken cannot be used: gigatoken fails on the check texts"):
        preprocess([str(src)], str(tmp_path / "g"), tokenizer_file, tokenizer_backend="gigatoken")
    assert not list(tmp_path.glob("g*"))
