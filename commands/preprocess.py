"""`mftk preprocess`: JSON/JSONL corpora to Megatron .bin/.idx or MindRecord (or merge existing pairs)."""
from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Callable, Iterator, Optional

from commands._argspec import JSON_OPT, Opt

EPILOG = """Examples:

  mftk preprocess --input corpus.jsonl.gz --tokenizer tokenizer.json --output-prefix data/wiki --append-eod

  mftk preprocess --input wiki='wiki/*.jsonl' --input code=code.jsonl --weights 0.7,0.3 \\
      --tokenizer tok/ --output-prefix data/mix --append-eod --on-error skip

  mftk preprocess --merge --input data/a_text_document --input data/b_text_document --output-prefix data/ab_text_document

  mftk preprocess --format mindrecord --seq-length 4096 --input corpus.jsonl --tokenizer tok/ \
      --output-prefix data/wiki --append-eod      # -> data/wiki_text.mindrecord for type: MindDataset

  # one of 8 machines (array job): writes data/wiki_shard3of8_text_document.{bin,idx}
  mftk preprocess --input 'wiki/*.jsonl' --tokenizer tok/ --output-prefix data/wiki --append-eod \
      --num-shards 8 --shard-index 3
  mftk preprocess --merge --input 'data/wiki_shard?of8_text_document' --output-prefix data/wiki_text_document
"""


# Typer builds the command from this table (`commands._argspec.typer_signature`), and `mftk preprocess` with a
# plain argv is parsed from it without importing Typer (`commands._argspec.parse`, from `commands.entry`).
OPTIONS: dict[str, Opt] = {
    "input": Opt(("--input", "-i"), str, "JSONL / JSON array file, gzip allowed; globs allowed (quote them). "
                 "NAME=PATH puts it in input group NAME (one output prefix per group). Repeatable.", many=True,
                 required=True, show_default=False),
    "output_prefix": Opt(("--output-prefix", "-o"), str, "Outputs are <prefix>[_<NAME>]_<key>_document.{bin,idx}; "
                         "with --merge, the exact output prefix.", required=True, show_default=False),
    "tokenizer": Opt(("--tokenizer", "-t"), Path, "Hugging Face tokenizer.json or the directory holding it (never "
                     "downloaded)."),
    "json_keys": Opt(("--json-keys",), str, "JSON key(s) holding the text (repeatable; default text).", many=True),
    "append_eod": Opt(("--append-eod",), bool, "Append the EOD id after each non-empty document (almost always "
                      "wanted).", default=False),
    "eod_token": Opt(("--eod-token",), str, "Token used as EOD (default: tokenizer_config eos_token, else "
                     "<|endoftext|> or </s>)."),
    "workers": Opt(("--workers", "-w"), int, "Tokenizer threads (default: all cores).", min=1),
    "compat": Opt(("--compat",), str, "megatron: uint16 below vocab 65500, empty docs dropped; mindformers: int32, "
                  "empty text kept as a zero-length sequence.", default="megatron"),
    "on_error": Opt(("--on-error",), str, "fail: stop at the first bad line; skip: list it in <prefix>.rejects.jsonl "
                    "and go on.", default="fail"),
    "max_errors": Opt(("--max-errors",), int, "With --on-error skip: stop after this many bad lines.", min=0),
    "weights": Opt(("--weights",), str, "Comma-separated weight per input group for the printed data_path (default: "
                   "proportional to tokens)."),
    "merge": Opt(("--merge",), bool, "Concatenate the existing prefixes given as --input.", default=False),
    "resume": Opt(("--resume",), bool, "Continue an interrupted run from its last completed input file.",
                  default=False),
    "format": Opt(("--format",), str, "megatron: .bin/.idx for BlendedMegatronDatasetDataLoader; mindrecord: "
                  "<prefix>_<key>.mindrecord for MindDataset (documents concatenated and cut into seq_length+1-token "
                  "samples; the last partial sample is dropped).", default="megatron"),
    "seq_length": Opt(("--seq-length",), int, "With --format mindrecord (required): the model's seq_length; each "
                      "record holds seq_length + 1 tokens.", min=1),
    "tokenizer_backend": Opt(("--tokenizer-backend",), str, "auto: gigatoken when its ids equal HF tokenizers' on a "
                             "sample of the input and edge cases (checked at start), else hf; gigatoken: require it; "
                             "hf: HF tokenizers only.", default="auto"),
    "num_shards": Opt(("--num-shards",), int, "Split every input group into N shards (by file and by byte range at "
                      "line ends) and process one; --merge the N outputs in order.", min=1),
    "shard_index": Opt(("--shard-index",), int, "Which shard this run processes, 0 to N-1 (with --num-shards).",
                       min=0),
    "json_out": JSON_OPT,
}


def preprocess(
    *, input: list[str], output_prefix: str, tokenizer: Optional[Path], json_keys: Optional[list[str]],
    append_eod: bool, eod_token: Optional[str], workers: Optional[int], compat: str, on_error: str,
    max_errors: Optional[int], weights: Optional[str], merge: bool, resume: bool, format: str,
    seq_length: Optional[int], tokenizer_backend: str, num_shards: Optional[int], shard_index: Optional[int],
    json_out: bool,
) -> None:
    """Tokenize JSON/JSONL corpora into Megatron .bin/.idx files (byte-identical to the reference tools) or MindRecord."""
    from mftk.files import cli_path

    input = [cli_path(item, "--input") for item in input]
    output_prefix = cli_path(output_prefix, "--output-prefix")
    tokenizer = None if tokenizer is None else Path(cli_path(str(tokenizer), "--tokenizer"))
    with _gc_paused_while_importing() as imported:
        from mftk.data.preload import TokenizerPreload, no_blas_threads, use_threads

        no_blas_threads()
        preload = None
        if tokenizer is not None and not merge:  # first: the loads run beside the imports below
            use_threads(workers)
            preload = TokenizerPreload(tokenizer, tokenizer_backend, eod_token, inputs=input, keys=json_keys)
        try:
            from commands._plain import print_json, skip_teardown
            from mftk.data.preprocess import preprocess as run
            from mftk.errors import InputError

            imported()
            parsed_weights = None
            if weights:
                try:
                    parsed_weights = [float(w) for w in weights.split(",")]
                except ValueError:
                    raise InputError(message=f"--weights {weights!r}: expected numbers separated by commas") from None
            summary = run(input, output_prefix, tokenizer, json_keys=json_keys or ["text"], append_eod=append_eod,
                          eod_token=eod_token, compat=compat, on_error=on_error, max_errors=max_errors,
                          workers=workers, weights=parsed_weights, resume=resume, merge_only=merge, format=format,
                          seq_length=seq_length, tokenizer_backend=tokenizer_backend, num_shards=num_shards,
                          shard_index=shard_index, progress=_progress(), preload=preload)
        finally:
            if preload is not None:
                preload.close()  # the HF helper process, if the run did not end it
        if json_out:
            data = summary.as_dict()
            data["data_path"] = summary.data_path_block()
            print_json(data)
        else:
            from commands._render import console

            _render(summary, console)
        if summary.format == "megatron":  # complete: fsynced and renamed (MindSpore's own exit hooks run as usual)
            skip_teardown(preload)  # its tokenizer is freed by the process's end, not by our return


@contextlib.contextmanager
def _gc_paused_while_importing() -> Iterator[Callable[[], None]]:
    """The cyclic GC off from the command's start until it calls the yielded function (its modules are
    loaded); then what they made is frozen out of the GC and the GC runs again (if it ran before) for the
    rest of the command; at the end, or on an error, the objects are unfrozen.

    Importing the modules (numpy, msgspec, the data layer) makes some 60 collections, 20 ms on the
    start-up's critical path, of objects that all live as long as the process; frozen, the collections
    during the run do not walk them either.
    """
    collecting = gc.isenabled()
    gc.disable()

    def imported() -> None:
        gc.freeze()
        if collecting:
            gc.enable()

    try:
        yield imported
    finally:
        gc.unfreeze()
        if collecting:
            gc.enable()


def _progress():
    """The progress bar on stderr; with no terminal there (a pipeline, ``--json`` into a file) not even
    Rich is imported, since the bar would be disabled anyway."""
    from commands._plain import stderr_surely_plain

    if stderr_surely_plain():
        from mftk.progress import NULL_PROGRESS

        return NULL_PROGRESS
    from commands._render import RichProgress, err_console

    return RichProgress(err_console)


def _render(summary, console) -> None:
    from commands._render import add_row, column, print_table, say, table

    mindrecord = summary.format == "mindrecord"
    cols = (("output", "docs", "samples", "tokens", "dropped tokens", "empty docs", "skipped lines", "file", ".db")
            if mindrecord else ("output", "docs", "sequences", "tokens", "empty docs", "skipped lines", ".bin", ".idx"))
    t = table(*(column(c, justify="left" if c == "output" else "right") for c in cols), title="mftk preprocess")
    for s in summary.sources:
        for i, o in enumerate(s.outputs):
            row = [o.prefix, f"{o.documents:,}", f"{o.sequences:,}", f"{o.tokens:,}"]
            row += [f"{o.dropped_tokens:,}"] if mindrecord else []
            row += [f"{s.empty_documents:,}" if i == 0 else "", f"{s.rejected:,}" if i == 0 else "",
                    _size(o.bin_bytes), _size(o.idx_bytes)]
            add_row(t, *row)
    print_table(t)
    eod = f"{summary.eod_id} ({summary.eod_token})" if summary.eod_id is not None else "none"
    facts = [f"dtype {summary.dtype}"]
    if mindrecord:
        facts.append(f"{summary.seq_length + 1} tokens per sample (seq_length {summary.seq_length})")
    if summary.tokenizer:
        facts += ([] if mindrecord else [f"compat {summary.compat}"]) + [f"vocab {summary.vocab_size:,}", f"EOD id {eod}"
                  + ("" if summary.append_eod else " (not appended)")]
        facts.append(f"tokenizer backend {summary.backend}")
    tokens_per_s = summary.tokens / summary.wall_s if summary.wall_s else 0
    facts.append(f"wall {summary.wall_s:.2f} s ({tokens_per_s:,.0f} tokens/s)")
    say("  ".join(facts))
    if summary.backend == "gigatoken":
        say(f"gigatoken: {summary.backend_note}")
    elif summary.tokenizer and summary.backend_note:
        say(("note:", "cyan"), f" {summary.backend_note}")
    for s in summary.sources:
        if s.rejects_path:
            say(f"{s.rejected} bad line(s) skipped, listed in {s.rejects_path}", style="yellow")
        if s.special_tokens_in_text:
            say(("note:", "cyan"), f" the EOD token appeared {s.special_tokens_in_text} time(s) inside the text "
                "itself and was encoded as the special token (as the reference tools do)")
        if s.resumed_files:
            say(f"resumed: {s.resumed_files} input file(s) were already done")
    if summary.tokenizer and summary.eod_id is not None:
        say("set ", (f"eod: {summary.eod_id}", "bold"), " in the training YAML (train_dataset.dataloader.config.eod)")
    if summary.shard is not None:
        k, n = summary.shard
        say(f"shard {k} of {n} (0-based) written; when all {n} are done, merge each output in shard order:")
        for command in summary.merge_commands():
            say(f"  {command}")
        return
    say("# for the training YAML (merge into its train_dataset section):")
    say(yaml_snippet(["train_dataset", "dataloader"] + ([] if mindrecord else ["config"]), summary.data_path_block()))


def yaml_snippet(parents: list[str], block: str) -> str:
    """``block`` (YAML keys at column 0) nested under ``parents``, two spaces a level: valid YAML to paste."""
    lines = [f"{'  ' * i}{key}:" for i, key in enumerate(parents)]
    pad = "  " * len(parents)
    return "\n".join(lines + [pad + line for line in block.splitlines()])


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
