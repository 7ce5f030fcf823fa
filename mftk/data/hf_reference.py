"""The HF tokenizers side of the backend check, in a helper process beside the run.

`mftk preprocess` needs the HF tokenizer (the reference) for a few facts (vocabulary size, the
EOD id, the special tokens its post-processor adds, its added tokens) and for the reference
ids of the check texts; with gigatoken chosen, it never encodes the data itself. Loading it is
60-160 ms of Rust that holds the GIL, which in the preprocess process would stall the imports
and gigatoken's own load behind it. So `Reference` starts a small helper process (``python -S``,
only the standard library and `tokenizers` imported: 0.1 s of CPU on the other core) that loads
it, sends the facts, then encodes the check texts the run sends it and sends their ids back.

Nothing is decided from what the helper says that the run could not check: the facts are what
`facts_of` computes in the run's process when there is no helper (the same function, the same
library), and the ids are compared with gigatoken's by `mftk.data.tokenize.BackendCheck`, as
before. Any trouble (no interpreter to start, the helper failing, dying, or answering something
else) makes `Reference` answer None, and the caller does the work in its own process as it did
without a helper, with its usual error messages.

This module imports only the standard library, so the command can start the helper first.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

# The helper's program: read the request, make this package and the parent's site-packages importable
# (``-S`` skips site, 30-40 ms of start-up), serve.
_PROGRAM = ("import json, sys; request = json.loads(sys.stdin.readline()); sys.path[:0] = request['path']; "
            "from mftk.data.hf_reference import serve; serve(request)")


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
    line = sys.stdin.readline()
    if not line:
        return  # the run did not need the ids (it failed, or chose another way)
    try:
        answer = {"ids": encode_lists(hf, json.loads(line)["texts"])}
    except BaseException as exc:  # noqa: BLE001
        answer = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out.write(json.dumps(answer) + "\n")
    out.flush()


class Reference:
    """The parent's end of one helper: `facts`, then `ids` of the texts given to `send`; None on any trouble."""

    def __init__(self, tokenizer_file: Path, eod_token: str | None) -> None:
        self.file, self.eod_token = Path(tokenizer_file), eod_token
        self._lock = threading.Lock()
        self._facts: dict | None = None
        self._facts_read = False
        self._sent = False
        self.proc = None
        root = str(Path(__file__).resolve().parent.parent.parent)  # the directory holding the mftk package
        request = {"path": [root] + [p for p in sys.path if p], "tokenizer": str(self.file),
                   "eod_token": eod_token}
        try:
            if not sys.executable:
                return
            self.proc = subprocess.Popen([sys.executable, "-S", "-c", _PROGRAM], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
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

    def send(self, texts: list[str]) -> bool:
        """Ask for the ids of ``texts`` (once); False if the helper cannot take them."""
        if self.facts() is None or self._sent or self.proc is None:
            return False
        self._sent = True
        try:
            self.proc.stdin.write((json.dumps({"texts": texts}) + "\n").encode())
            self.proc.stdin.flush()
            self.proc.stdin.close()
        except (OSError, ValueError):
            self.close()
            return False
        return True

    def ids(self) -> list[list[int]] | None:
        """HF's ids of the texts given to `send` (waits for them), or None."""
        with self._lock:
            answer = self._read() if self._sent else None
            self.close()
        ids = answer.get("ids") if answer else None
        return ids if isinstance(ids, list) else None

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
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_reference(tokenizer_file: Path, eod_token: str | None) -> Reference | None:
    """A helper for ``tokenizer_file``, or None where it cannot be used (no such regular file)."""
    try:
        if not tokenizer_file.is_file():
            return None
    except OSError:
        return None
    return Reference(tokenizer_file, eod_token)
