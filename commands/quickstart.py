"""`mftk quickstart`: the whole workflow on built-in data, every command once, in a few minutes.

Stages 1, 2 and the config file are library calls (`mftk/quickstart.py`); every other stage runs
the real `mftk <verb>` command as its own process, from the work directory, and shows the line it
runs, so a newcomer can copy it. A separate process per command keeps MindSpore (and msrun) out of
this process and makes each stage's exit code the quick-start's verdict: the first stage that
fails stops the run with its own error on stderr and its own exit code.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.markup import escape

from commands._options import NprocOpt

EPILOG = """[bold]Examples[/]

  mftk quickstart                          [dim]# in ./quickstart, 2 workers through msrun[/]
  mftk quickstart --workdir /tmp/qs --model deepseek_v3 --nproc 1 --steps 30

Stages: 1 corpus from Python's own text, 2 byte-level BPE tokenizer, 3 preprocess, \
4 config + validate-config + plan-parallel, 5 train, 6 inspect-ckpt + resume + parse-log --plot.

Exit codes: 0 done; otherwise the exit code of the stage that failed (its error is shown above it)."""

STAGES = 6


def quickstart(
    workdir: Annotated[Path, typer.Option(
        "--workdir", help="Directory for every output (created; reused if it exists, the previous output/ kept as "
                          "output.previous/).")] = Path("quickstart"),
    model: Annotated[str, typer.Option("--model", help="qwen3 (dense) or deepseek_v3 (MLA + MoE + MTP).")] = "qwen3",
    nproc: NprocOpt = 2,
    steps: Annotated[Optional[int], typer.Option(
        "--steps", min=2, help="Training steps (default: per model, enough for the loss to drop visibly); "
                               "resume then adds --resume-steps.")] = None,
    resume_steps: Annotated[int, typer.Option("--resume-steps", min=1,
                                              help="Extra steps run by `mftk resume`.")] = 10,
    max_chars: Annotated[Optional[int], typer.Option("--max-chars", min=10_000, hidden=True)] = None,
    vocab_size: Annotated[Optional[int], typer.Option("--vocab-size", min=257, hidden=True)] = None,
) -> None:
    """Run the whole workflow on built-in data: corpus, tokenizer, preprocess, config, train, inspect, resume, plot."""
    from mftk.quickstart import make_plan

    started = time.perf_counter()
    plan = make_plan(workdir, model=model, nproc=nproc, steps=steps, resume_steps=resume_steps,
                     max_chars=max_chars, vocab_size=vocab_size)
    commands = plan.commands()
    docs = _stage(1, "corpus from Python's own documentation and sources", lambda: _corpus(plan))
    tok = _stage(2, "byte-level BPE tokenizer", lambda: _tokenizer(plan, docs))
    _stage(3, "preprocess: JSON lines -> Megatron .bin/.idx", lambda: _mftk(plan, commands["preprocess"]))
    _stage(4, "config from the template, validate-config, plan-parallel",
           lambda: _config(plan, tok, commands))
    _stage(5, f"train a tiny {model} for {plan.steps} steps on {nproc} worker(s)",
           lambda: _train(plan, commands))
    _stage(6, "inspect-ckpt the last step, resume, parse-log with a plot",
           lambda: [_mftk(plan, commands[v]) for v in ("inspect-ckpt", "resume", "parse-log")])
    _finish(plan, time.perf_counter() - started)


def _stage(n: int, title: str, body: Callable):
    """A header, the body, and a ✓/✗ line; an error stops the quick-start with its own exit code."""
    from rich.markup import escape

    from commands._render import console, say
    from mftk.errors import MftkError

    console.rule(f"[bold]{n}/{STAGES}[/] {escape(title)}", align="left")
    t0 = time.perf_counter()
    try:
        result = body()
    except MftkError as exc:
        code = getattr(exc, "exit_code", None)
        say((f"✗ stage {n}/{STAGES} failed", "bold red"), f" (exit code {code})" if code else "", err=True)
        raise
    say(("✓", "green"), f" stage {n} done in {time.perf_counter() - t0:.1f} s")
    return result


def _corpus(plan) -> list[dict]:
    from commands._render import say
    from mftk.quickstart import build_corpus

    result, docs = build_corpus(plan)
    say(f"{result.documents:,} documents, {result.chars:,} characters -> {plan.corpus} "
        f"({result.bytes / 2**20:.1f} MiB)")
    return docs


def _tokenizer(plan, docs):
    from commands._render import say
    from mftk.quickstart import build_tokenizer

    tok = build_tokenizer(plan, docs)
    say(f"vocabulary {tok.vocab_size:,}, EOD {tok.eod_token} = id {tok.eod_id} -> {plan.tokenizer}")
    return tok


def _config(plan, tok, commands) -> None:
    from commands._render import say
    from mftk.quickstart import template_path, write_config

    path = write_config(plan, tok.vocab_size, tok.eod_id)
    say(f"templates/{template_path(plan.model).name} -> {plan.config} (data, vocab, steps, "
        f"checkpoint dir overridden; see the header of {path.name})")
    _mftk(plan, commands["validate-config"])
    _mftk(plan, commands["plan-parallel"])


def _train(plan, commands) -> None:
    from commands._render import say
    from mftk.quickstart import set_aside_previous_output

    previous = set_aside_previous_output(plan)
    if previous is not None:
        say(f"the previous run's {plan.output_dir}/ is now {previous.name}/")
    _mftk(plan, commands["train"])


def _mftk(plan, argv: list[str]) -> None:
    """Run `mftk ARGV` from the work directory, streaming its stdout/stderr; stop on a non-zero exit."""
    import os
    import subprocess
    import sys
    import threading

    from commands._render import console, err_console


    console.print(f"[dim]$ mftk {escape(' '.join(_quote(a) for a in argv))}[/]", highlight=False, soft_wrap=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS=str(console.width))
    if console.is_terminal:
        env["FORCE_COLOR"] = "1"  # the child's stdout is a pipe; let it draw tables and bars in colour anyway
    # Its own session: a terminal's Ctrl-C reaches only us, and we pass on exactly what we get (a kill of
    # this process too), so the stage sees one signal per Ctrl-C and saves-then-exits 75 as `mftk train` does.
    proc = subprocess.Popen([sys.executable, "-m", "mftk", *argv], cwd=plan.workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    pumps = [threading.Thread(target=_pump, args=(stream, target), daemon=True)
             for stream, target in ((proc.stdout, console), (proc.stderr, err_console))]
    for t in pumps:
        t.start()
    try:
        with _forward_signals(proc):
            code = proc.wait()
    finally:
        for t in pumps:
            t.join()
    if code != 0:
        from mftk.errors import SubcommandFailed

        rerun = f"cd {plan.workdir} && mftk {' '.join(_quote(a) for a in argv)}"
        if code in (75, 130):
            raise SubcommandFailed(message=f"`mftk {argv[0]}` was stopped by a signal (exit code {code})",
                                   exit_code=code, hint=f"rerun the stage by hand when you want: {rerun}"
                                   + (" (or continue it with mftk resume)" if argv[0] == "train" else ""))
        raise SubcommandFailed(message=f"`mftk {argv[0]}` exited with code {code}", exit_code=code,
                               hint=f"fix the problem above, then rerun the stage by hand: {rerun}")


class _forward_signals:
    """While a stage runs: SIGTERM/SIGINT sent to the quick-start go on to the stage's process."""

    def __init__(self, proc) -> None:
        self.proc, self.old = proc, {}

    def __enter__(self) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def _pump(stream, console) -> None:
    """Copy a child's output to our console's file as it arrives (chunks, so progress bars redraw)."""
    import codecs
    import os

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = stream.fileno()
    while chunk := os.read(fd, 65536):
        console.file.write(decoder.decode(chunk))
        console.file.flush()
    console.file.write(decoder.decode(b"", final=True))
    console.file.flush()


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _finish(plan, wall_s: float) -> None:
    """Where everything is, the loss curve in two numbers, and what to try next."""
    from commands._render import add_row, column, console, notice, print_table, say, styled, table
    from mftk.logs.report import parse_log
    from mftk.quickstart import checkpoint_steps, list_outputs

    console.rule("[bold]done[/]", align="left")
    t = table("what", "path", column("size", justify="right"), title=f"outputs under {plan.workdir}")
    for out in list_outputs(plan):
        add_row(t, out.what, str(out.path), _human(out.bytes) if out.bytes else styled("missing", "red"))
    print_table(t)
    steps = checkpoint_steps(plan)
    say(f"checkpoints at steps {', '.join(map(str, steps)) or 'none'}")
    summary = parse_log([plan.at(plan.rank0_log)]).runs[0].summary
    if summary.loss_first is not None:
        drop = summary.loss_first - summary.loss_last
        say("loss ", (f"{summary.loss_first:.3f} -> {summary.loss_last:.3f}", "green" if drop > 0 else "yellow"),
            f" (min {summary.loss_min:.3f}) over steps {summary.first_step}..{summary.last_step}")
        if drop <= 0:
            notice("warning", "the loss did not drop; try more --steps")
    say(f"total wall time {wall_s:.0f} s")
    say(f"next: cd {plan.workdir} && mftk parse-log {plan.rank0_log} --follow   ",
        (f"or edit {plan.config} and mftk train it", "dim"))
    activate = activate_hint()
    if activate:
        say(activate)


def activate_hint() -> str:
    """How to get `mftk` on PATH when it is not (after `make demo` it lives in .venv/bin), else ''."""
    import os
    import shutil
    import sys

    if shutil.which("mftk"):
        return ""
    bindir = Path(sys.executable).parent
    if not (bindir / "mftk").exists():
        return ""
    where = os.path.relpath(bindir)
    if (bindir / "activate").exists():
        return f"mftk is not on PATH: run `source {where}/activate` first (or call {where}/mftk)"
    return f"mftk is not on PATH: call {where}/mftk"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
