"""`mftk preprocess`: JSON/JSONL corpora to Megatron .bin/.idx or MindRecord (or merge existing pairs)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commands._options import JsonOpt

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


def preprocess(
    input: Annotated[list[str], typer.Option("--input", "-i", help="JSONL / JSON array file, gzip allowed; globs "
                                             "allowed (quote them). NAME=PATH puts it in input group NAME "
                                             "(one output prefix per group). Repeatable.", show_default=False)],
    output_prefix: Annotated[str, typer.Option("--output-prefix", "-o", help="Outputs are <prefix>[_<NAME>]_<key>"
                                               "_document.{bin,idx}; with --merge, the exact output prefix.",
                                               show_default=False)],
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", "-t", help="Hugging Face tokenizer.json "
                                                      "or the directory holding it (never downloaded).")] = None,
    json_keys: Annotated[Optional[list[str]], typer.Option("--json-keys", help="JSON key(s) holding the text "
                                                           "(repeatable; default text).")] = None,
    append_eod: Annotated[bool, typer.Option("--append-eod", help="Append the EOD id after each non-empty "
                                             "document (almost always wanted).")] = False,
    eod_token: Annotated[Optional[str], typer.Option("--eod-token", help="Token used as EOD (default: "
                                                     "tokenizer_config eos_token, else <|endoftext|> or </s>).")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", "-w", min=1, help="Tokenizer threads "
                                                   "(default: all cores).")] = None,
    compat: Annotated[str, typer.Option("--compat", help="megatron: uint16 below vocab 65500, empty docs dropped; "
                                        "mindformers: int32, empty text kept as a zero-length sequence.")] = "megatron",
    on_error: Annotated[str, typer.Option("--on-error", help="fail: stop at the first bad line; skip: list it in "
                                          "<prefix>.rejects.jsonl and go on.")] = "fail",
    max_errors: Annotated[Optional[int], typer.Option("--max-errors", min=0, help="With --on-error skip: stop "
                                                      "after this many bad lines.")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", help="Comma-separated weight per input group for "
                                                   "the printed data_path (default: proportional to tokens).")] = None,
    merge: Annotated[bool, typer.Option("--merge", help="Concatenate the existing prefixes given as --input.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run from its last completed "
                                         "input file.")] = False,
    format: Annotated[str, typer.Option("--format", help="megatron: .bin/.idx for BlendedMegatronDatasetDataLoader; "
                                        "mindrecord: <prefix>_<key>.mindrecord for MindDataset (documents "
                                        "concatenated and cut into seq_length+1-token samples; the last partial "
                                        "sample is dropped).")] = "megatron",
    seq_length: Annotated[Optional[int], typer.Option("--seq-length", min=1, help="With --format mindrecord "
                                                      "(required): the model's seq_length; each record holds "
                                                      "seq_length + 1 tokens.")] = None,
    tokenizer_backend: Annotated[str, typer.Option("--tokenizer-backend", help="auto: gigatoken when its ids equal "
                                                   "HF tokenizers' on a sample of the input and edge cases (checked "
                                                   "at start), else hf; gigatoken: require it; hf: HF tokenizers "
                                                   "only.")] = "auto",
    num_shards: Annotated[Optional[int], typer.Option("--num-shards", min=1, help="Split every input group into N "
                                                      "shards (by file and by byte range at line ends) and "
                                                      "process one; --merge the N outputs in order.")] = None,
    shard_index: Annotated[Optional[int], typer.Option("--shard-index", min=0, help="Which shard this run "
                                                       "processes, 0 to N-1 (with --num-shards).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Tokenize JSON/JSONL corpora into Megatron .bin/.idx files (byte-identical to the reference tools) or MindRecord."""
    from mftk.data.preload import TokenizerPreload, no_blas_threads, use_threads

    no_blas_threads()
    preload = None
    if tokenizer is not None and not merge:  # first: the loads run beside the imports below
        use_threads(workers)
        preload = TokenizerPreload(tokenizer, tokenizer_backend, eod_token)

    import attrs

    from commands._plain import print_json, skip_teardown
    from mftk.data.preprocess import preprocess as run
    from mftk.errors import InputError

    parsed_weights = None
    if weights:
        try:
            parsed_weights = [float(w) for w in weights.split(",")]
        except ValueError:
            raise InputError(message=f"--weights {weights!r}: expected numbers separated by commas") from None
    try:
        summary = run(input, output_prefix, tokenizer, json_keys=json_keys or ["text"], append_eod=append_eod,
                      eod_token=eod_token, compat=compat, on_error=on_error, max_errors=max_errors, workers=workers,
                      weights=parsed_weights, resume=resume, merge_only=merge, format=format, seq_length=seq_length,
                      tokenizer_backend=tokenizer_backend, num_shards=num_shards, shard_index=shard_index,
                      progress=_progress(), preload=preload)
    finally:
        if preload is not None:
            preload.close()  # the HF helper process, if the run did not end it
    if json_out:
        data = attrs.asdict(summary)
        data["data_path"] = summary.data_path_block()
        print_json(data)
    else:
        from commands._render import console

        _render(summary, console)
    if summary.format == "megatron":  # complete: fsynced and renamed (MindSpore's own exit hooks run as usual)
        skip_teardown()


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
