"""The HF tokenizers side of the backend check, in a helper process beside the run.

`mftk preprocess` needs the HF tokenizer (the reference) for a few facts (vocabulary size, the
EOD id, the special tokens its post-processor adds, its added tokens) and for the reference
ids of the check texts; with gigatoken chosen, it never encodes the data itself. Loading it is
60-160 ms of Rust that holds the GIL, which in the preprocess process would stall the imports
and gigatoken's own load behind it. So `Reference` starts a small helper process (``python -S``,
only the standard library and `tokenizers` imported: 0.1 s of CPU on the other core) that loads
it and sends the facts; then it samples the input itself (`mftk.data.inputs.check_sample`),
encodes the check texts (`check_cases`) and sends them with their ids, all while the run is still
importing its modules, so that none of the check's HF work competes with the run's own encoding.

Nothing is decided from what the helper says that the run could not check: the facts are what
`facts_of` computes in the run's process when there is no helper (the same function, the same
library), the check texts are what `check_cases` gives there (the same sample of the same files),
and the ids are compared with gigatoken's by `mftk.data.tokenize.BackendCheck`, as before. Any
trouble (no interpreter to start, the helper failing, dying, or answering something else) makes
`Reference` answer None, and the caller does the work in its own process as it did without a
helper, with its usual error messages.

This module imports only the standard library, so the command can start the helper first.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# The helper's program: yield the CPU to the run (niceness +10: the run wants the facts only after its own
# start-up and the check only before it keeps its output, while its encoding slows for every slice of a core the
# helper takes: 3-5% of a run over the 50 MB benchmark corpus), read the request, make this package and the
# parent's site-packages importable (``-S`` skips site, 30-40 ms of start-up), serve.
_PROGRAM = ("import os; os.nice(10); import json, sys; request = json.loads(sys.stdin.readline()); "
            "sys.path[:0] = request['path']; from mftk.data.hf_reference import serve; serve(request); os._exit(0)")


def special_wrap(hf) -> tuple[list[int], list[int]] | None:
    """(prefix, suffix) ids the post-processor puts around every single text, or None if it does more."""
    found = None
    for probe in ("a", "Hello world", "x y z 1 2 3"):
        plain = hf.encode(probe, add_special_tokens=False).ids
        full = hf.encode(probe, add_special_tokens=True).ids
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), None)
        if not plain or at is None:
            return None
        wrap = (full[:at], full[at + len(plain):])
        if found is not None and wrap != found:
            return None
        found = wrap
    if hf.encode("", add_special_tokens=True).ids != found[0] + found[1]:
        return None
    return found


def added_token_cases(hf) -> list[tuple[str, str]]:
    """Every added token inside text, alone and glued to words (special tokens in documents)."""
    tokens = sorted(t.content for t in hf.get_added_tokens_decoder().values())[:64]
    return [(f"added token {t!r} inside text", f"{t}a{t} b {t}\n{t}{t}x{t}") for t in tokens]


# Fixed strings every check includes, named so a difference says which kind of text differs.
EDGE_CASES: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("one space", " "),
    ("whitespace only", " \t\n\r\n  \u3000\u00a0 "),
    ("newlines", "line one\n\nline two\r\nthree\n"),
    ("leading and trailing spaces", "   padded text   "),
    ("non-ASCII", "Ünïcödé façade naïve café — 東京 😀 ¿Qué? Привет мир مرحبا नमस्ते"),
    ("decomposed accents (NFD)", "e\u0301 a\u0308 n\u0303 cafe\u0301"),
    ("compatibility characters (NFKC)", "ﬁne ﬂow Ｆｕｌｌ ①②③ ㎞ ½ ™"),
    ("case", "HeLLo WORLD It'S I'M WE'LL they'VE"),
    ("contractions", "it's we're they've I'm you'll he'd don't"),
    ("digits", "1234567890 3.14159 2026-12-01 0x1F 1,000,000 ١٢٣"),
    ("control characters", "a\x00b\x07c\x1bd\x7fe\u200bf\u2028g\ufeffh"),
    ("emoji sequences", "👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇫🇷"),
    ("code", "def f(x):\n\treturn {'a': [1, 2]}  # comment\n    if x != None: pass"),
    ("very long word", "a" * 5000),
    ("very long mixed word", "xY9" * 2000),
    ("long whitespace run", " " * 3000 + "x" + "\n" * 500),
    ("long emoji run", "😀" * 1000),
    ("long non-ASCII word", "东京" * 1500),
)


_SAMPLED = "input text "  # the start of every sampled case's name


def check_cases(added_cases: list, sample: list[str]) -> list[tuple[str, str]]:
    """The named texts the backend check encodes with both tokenizers: `EDGE_CASES`, the added tokens
    inside text (`added_token_cases`), then the ``sample`` of the input."""
    return ([(name, text) for name, text in EDGE_CASES] + [(name, text) for name, text in added_cases]
            + [(f"{_SAMPLED}{i + 1} of the sample", text) for i, text in enumerate(sample)])


def sampled(cases: list[tuple[str, str]]) -> int:
    """How many of the `check_cases` texts come from the input."""
    return sum(name.startswith(_SAMPLED) for name, _ in cases)


# Tried in order when neither --eod-token nor tokenizer_config.json names the end-of-document token.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


class NoSuchToken(LookupError):
    """The EOD token asked for is not in the vocabulary."""


def resolve_eod(hf, file: Path, eod_token: str | None) -> tuple[str | None, int | None]:
    """(EOD token, its id): ``eod_token``; else the ``eos_token`` of a ``tokenizer_config.json`` next to
    ``file`` (what Megatron's HF tokenizer uses as ``eod``) if the vocabulary has it; else the first of
    `EOD_CANDIDATES` it has; else (None, None). An ``eod_token`` the vocabulary lacks raises `NoSuchToken`."""
    if eod_token is None:
        eod_token = _config_eos(file.parent / "tokenizer_config.json")
        if eod_token is not None and hf.token_to_id(eod_token) is None:
            eod_token = None
    if eod_token is None:
        eod_token = next((t for t in EOD_CANDIDATES if hf.token_to_id(t) is not None), None)
        return eod_token, hf.token_to_id(eod_token) if eod_token else None
    eod_id = hf.token_to_id(eod_token)
    if eod_id is None:
        raise NoSuchToken(eod_token)
    return eod_token, eod_id


def _config_eos(config: Path) -> str | None:
    if not config.is_file():
        return None
    from mftk.errors import InputError
    from mftk.files import CONFIG_LIMIT, read_json

    try:
        value = read_json(config, limit=CONFIG_LIMIT, what="tokenizer_config.json").get("eos_token")
    except (OSError, InputError, AttributeError):
        return None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def facts_of(hf) -> dict:
    """What the backend check needs from the HF tokenizer besides ids (JSON-able)."""
    wrap = special_wrap(hf)
    return {"truncation_or_padding": bool(getattr(hf, "truncation", None) or getattr(hf, "padding", None)),
            "wrap": [list(wrap[0]), list(wrap[1])] if wrap is not None else None,
            "added_cases": [list(case) for case in added_token_cases(hf)]}


def encode_lists(hf, texts: list[str]) -> list[list[int]]:
    """HF's ids of ``texts``, special tokens added: what the reference scripts get."""
    encode = getattr(hf, "encode_batch_fast", hf.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=True)]


def serve(request: dict) -> None:
    """The helper process: load, send the facts, encode the check texts it is sent, send their ids."""
    out = sys.stdout
    try:
        from tokenizers import Tokenizer

        hf = Tokenizer.from_file(request["tokenizer"])
        eod_token, eod_id = resolve_eod(hf, Path(request["tokenizer"]), request["eod_token"])
        facts = {"vocab_size": hf.get_vocab_size(with_added_tokens=True), "eod_token": eod_token,
                 "eod_id": eod_id, **facts_of(hf)}
    except BaseException as exc:  # noqa: BLE001 - the run loads it itself and reports the problem
        out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"facts": facts}) + "\n")
    out.flush()
    sample = request.get("sample")
    if not sample:
        return  # the run wants no check (or could not name its inputs)
    try:
        from mftk.data.inputs import check_sample

        cases = check_cases(facts["added_cases"], check_sample([Path(p) for p in sample["paths"]], sample["keys"]))
        answer = {"cases": cases, "ids": encode_lists(hf, [text for _, text in cases])}
    except BaseException as exc:  # noqa: BLE001 - the run samples and encodes the check itself
        answer = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out.write(json.dumps(answer) + "\n")
    out.flush()


class Reference:
    """The parent's end of one helper: its `facts`, then the backend `check` it computed; None on any trouble.

    ``sample``: the input files and JSON keys the helper samples the check texts from (`check_sample`);
    None: facts only.
    """

    def __init__(self, tokenizer_file: Path, eod_token: str | None, sample: dict | None = None) -> None:
        import subprocess  # here, not at the top: the helper imports this module and needs neither
        import threading

        self.file, self.eod_token = Path(tokenizer_file), eod_token
        self._lock = threading.Lock()
        self._facts: dict | None = None
        self._facts_read = False
        self._checked = sample is None
        self.proc = None
        root = str(Path(__file__).resolve().parent.parent.parent)  # the directory holding the mftk package
        request = {"path": [root] + [p for p in sys.path if p], "tokenizer": str(self.file),
                   "eod_token": eod_token, "sample": sample}
        try:
            if not sys.executable:
                return
            # one thread: the helper's encoding is small, and a second would take a core from the run's start
            env = {**os.environ, "RAYON_NUM_THREADS": "1"}
            self.proc = subprocess.Popen([sys.executable, "-S", "-c", _PROGRAM], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True, env=env)
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.close()
        except (OSError, ValueError):
            self.close()

    def facts(self) -> dict | None:
        """vocab_size, eod_token, eod_id, truncation_or_padding, wrap, added_cases; or None."""
        with self._lock:
            if not self._facts_read:
                self._facts_read = True
                answer = self._read()
                self._facts = answer.get("facts") if answer else None
                if self._facts is None:
                    self.close()
            return self._facts

    def check(self) -> tuple[list[tuple[str, str]], list[list[int]]] | None:
        """(the named check texts, HF's ids of each) as the helper computed them (waits for them), or None.
        Once only: the helper is collected then."""
        if self.facts() is None:
            return None
        with self._lock:
            answer = None if self._checked else self._read()
            self._checked = True
            self.close()
        cases, ids = (answer or {}).get("cases"), (answer or {}).get("ids")
        if not (isinstance(cases, list) and isinstance(ids, list) and len(cases) == len(ids)):
            return None
        return [(name, text) for name, text in cases], ids

    def _read(self) -> dict | None:
        if self.proc is None:
            return None
        try:
            answer = json.loads(self.proc.stdout.readline() or b"null")
        except (OSError, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    def close(self) -> None:
        """End the helper (it exits when its input closes) and collect it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        import subprocess

        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_reference(tokenizer_file: Path, eod_token: str | None, sample: dict | None = None) -> Reference | None:
    """A helper for ``tokenizer_file``, or None where it cannot be used (no such regular file)."""
    try:
        if not tokenizer_file.is_file():
            return None
    except OSError:
        return None
    return Reference(tokenizer_file, eod_token, sample)
