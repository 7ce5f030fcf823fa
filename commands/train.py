"""`mftk train`: validate one YAML, then train in this process with MindSpore Transformers log lines.

The library, the engine and Rich are imported inside the functions that use them: `mftk --help` and
`mftk train --help` import none of them (tests/test_architecture.py).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from commands._options import ConfigArg, DeviceOpt, NprocOpt, OutputDirOpt, SetOpt, with_device

EPILOG = """Examples:

  mftk train templates/qwen3_tiny.yaml

  mftk train my.yaml --set training.steps=20 --set checkpoint.save_path=./ckpt --output-dir ./output

  mftk train templates/qwen3_tiny.yaml --nproc 2          # 2 workers through msrun (data parallel / FSDP)

  mftk train my.yaml --nproc 2 --max-restarts 3 --hang-timeout 600   # relaunch from the last checkpoint on a fault

  mftk train my.yaml --device CPU                          # whatever context.device_target says

  mftk train my.yaml --nproc 1 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 20480   # node 0 of 2

Step lines go to stdout and to OUTPUT/log/rank_<r>/info.log (metrics.jsonl next to it); with --nproc > 1,
msrun's worker_<rank>.log files go to OUTPUT/msrun_log (or --log-dir) and rank 0's progress is shown here.
SIGTERM/SIGINT save a checkpoint at the current step and exit with code 75; continue with `mftk resume`.
"""

NnodesOpt = Annotated[int, typer.Option("--nnodes", min=1, help="Machines in the job (each runs --nproc workers).")]
NodeRankOpt = Annotated[int, typer.Option("--node-rank", min=0, help="This machine's index, 0..nnodes-1.")]
MasterAddrOpt = Annotated[str, typer.Option("--master-addr", help="Address of node 0 (the msrun scheduler).")]
MasterPortOpt = Annotated[Optional[int], typer.Option(
    "--master-port", min=1024, max=65535, help="Scheduler port (default: a free one; required with --nnodes > 1).")]
LogDirOpt = Annotated[Optional[Path], typer.Option("--log-dir", help="Where msrun writes worker_<rank>.log "
                                                   "(default: OUTPUT/msrun_log).")]
JoinOpt = Annotated[bool, typer.Option("--join/--no-join", help="Wait for the workers (default) or start them "
                                       "and return at once.")]
MaxRestartsOpt = Annotated[int, typer.Option(
    "--max-restarts", min=0, help="With --nproc/--nnodes > 1: when a worker dies or a rank hangs, end the job and "
    "relaunch it from the newest checkpoint in checkpoint.save_path, up to N times (0: fail at once). With "
    "--nnodes > 1 give every node the same N: each node restarts, and restart a meets on --master-port + 2a.")]
HangTimeoutOpt = Annotated[Optional[float], typer.Option(
    "--hang-timeout", min=0.001, help="With --nproc/--nnodes > 1: seconds a rank may make no progress before the "
    "job is ended as hung, naming the ranks (default: mftk.hang_timeout_s, else derived from the step time).")]
NewRunOpt = Annotated[bool, typer.Option("--new-run", help="Start at step 0 although checkpoint.save_path holds "
                                         "checkpoints of another run (they are kept; the tracker moves to this run).")]


def train(config: ConfigArg, overrides: SetOpt = None, output_dir: OutputDirOpt = None, nproc: NprocOpt = 1,
          nnodes: NnodesOpt = 1, node_rank: NodeRankOpt = 0, master_addr: MasterAddrOpt = "127.0.0.1",
          master_port: MasterPortOpt = None, log_dir: LogDirOpt = None, join: JoinOpt = True,
          new_run: NewRunOpt = False, device: DeviceOpt = None, max_restarts: MaxRestartsOpt = 0,
          hang_timeout: HangTimeoutOpt = None) -> None:
    """Train a model from one YAML (validated first; a bad config never starts a run)."""
    run_command(config, with_device(overrides, device), output_dir, new_run=new_run,
                launcher=launcher_spec(nproc, nnodes, node_rank, master_addr, master_port, log_dir, join,
                                       hang_timeout), max_restarts=max_restarts)


def launcher_spec(nproc: int, nnodes: int, node_rank: int, master_addr: str, master_port: Optional[int],
                  log_dir: Optional[Path], join: bool, hang_timeout: Optional[float] = None) -> Any:
    from mftk.engine.launch import LaunchSpec

    return LaunchSpec(nproc=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                      master_port=master_port, log_dir=log_dir, join=join, hang_timeout_s=hang_timeout)


def run_command(config: Path, overrides: Optional[list[str]], output_dir: Optional[Path], *, launcher: Any,
                resume_from: Optional[Path] = None, weights_only: bool = False, dry_run: bool = False,
                new_run: bool = False, model_from_checkpoint: bool = False, max_restarts: int = 0) -> Any:
    """Shared by `train` and `resume`: load + validate, run (in this process or as an msrun job: the library's
    one choice, `mftk.engine.workers.start`), render the result."""
    # lazy: `mftk --help` imports neither the config model nor the engine (tests/test_architecture.py)
    from commands._render import say
    from mftk.config.load import load_config
    from mftk.engine.workers import start
    from mftk.logs.sinks import mf_console_handler

    _check_fault_options(launcher, max_restarts)
    loaded = load_config(config, overrides=overrides or [], world_size=launcher.world)
    display = LiveDisplay()

    def echo(line: str) -> None:  # an msrun job: the log lines of the rank that logs the loss, as they come
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def restarted(restart: Any) -> None:
        display.close()
        say(f"{restart.line()}\n  because: {restart.message.splitlines()[0]}")

    console = mf_console_handler(sys.stderr if dry_run else sys.stdout)  # a dry run's plan owns stdout
    try:
        result = start(loaded, config, spec=launcher, overrides=overrides or [],
                       output_dir=output_dir or Path("output"), sinks=[display], console=console, on_log_line=echo, on_restart=restarted,
                       resume_from=resume_from, weights_only=weights_only, dry_run=dry_run, new_run=new_run,
                       model_from_checkpoint=model_from_checkpoint, max_restarts=max_restarts)
    finally:
        display.close()
    render(result)
    return result


def _check_fault_options(launcher: Any, max_restarts: int) -> None:
    """--max-restarts and --hang-timeout act on an msrun job the parent waits for; elsewhere they are refused."""
    from mftk.errors import InputError

    given = [name for name, on in (("--max-restarts", max_restarts > 0),
                                   ("--hang-timeout", launcher.hang_timeout_s is not None)) if on]
    if given and launcher.world == 1:
        raise InputError(message=f"{' and '.join(given)} need a multi-process job (--nproc or --nnodes > 1)",
                         hint="a one-process run has no workers to watch or relaunch: drop the option")
    if given and not launcher.join:
        raise InputError(message=f"{' and '.join(given)} need the parent to wait for the job (not --no-join)",
                         hint="drop --no-join, or the option")


def render(result: Any) -> None:
    from commands._render import say

    if result.dry_run:
        return
    if not result.log_file:  # --no-join: the workers run on
        for note in result.notes:
            say(note)
        return
    done = result.final_step - result.start_step
    last = f", last loss {result.losses[-1]:.6f}" if result.losses else ""
    say(f"trained steps {result.start_step + 1 if done else result.start_step}..{result.final_step} "
        f"of {result.total_steps}{last}")
    rates = run_summary(result) if done else ""
    if rates:
        say(rates)
    if result.skipped_steps:
        say(f"skipped steps (non-finite loss): {result.skipped_steps}")
    if result.checkpoint:
        say(f"checkpoint: {_near(result.checkpoint)}")
    say(f"logs: {result.log_file}  metrics: {result.metrics_file}")
    say("start-up: " + ", ".join(f"{name} {s:.2f}s" for name, s in result.phases))


def _near(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (what the user typed), else as is with
    the home folder written ``~`` (a ``save_path: ~/ck`` reads back as written)."""
    import os

    from mftk.files import home_relative

    try:
        rel = os.path.relpath(path)
    except ValueError:
        return home_relative(path)
    return home_relative(path) if rel.startswith("..") else rel


def run_summary(result: Any) -> str:
    """'model 623K parameters; 1,514 tokens/s, 3.42 GFLOP/s per device (steps 2..3)' from the run's exact
    metrics (metrics.jsonl), in units that show the value on a CPU as on a cluster."""
    from mftk.errors import MftkError
    from mftk.logs.report import ParseOptions, parse_log
    from mftk.units import count, flops_rate

    parts = []
    total, active = result.parameters  # of the model trained (the checkpoint's architecture when it was taken)
    if total:
        parts.append(f"model {count(total)} parameters" + (f" ({count(active)} active)" if active != total else ""))
    metrics = Path(result.metrics_file)
    if metrics.is_file():
        try:
            s = parse_log([metrics], ParseOptions(fmt="mftk")).runs[0].summary
        except MftkError:
            s = None
        if s is not None:
            rates = [f"{s.tokens_per_s:,.0f} tokens/s" if s.tokens_per_s else "",
                     f"{flops_rate(s.throughput_tflops)} per device" if s.throughput_tflops is not None else ""]
            rates = [r for r in rates if r]
            if rates:
                steady = f"steps {s.first_step + s.warmup_skipped}..{s.last_step}"
                parts.append(", ".join(rates) + f" ({steady})")
    return "; ".join(parts)


class LiveDisplay:
    """A StepSink showing step, loss, tokens/s, ETA and per-phase times live on a terminal (stderr).

    When stderr is not a terminal it shows nothing: the plain step lines on stdout are the record.
    """

    def __init__(self) -> None:
        from commands._render import err_console

        self.console = err_console
        self.live = None
        self.t0 = time.perf_counter()
        self.first_step: int | None = None

    def _table(self, m: dict[str, Any]) -> Any:
        from rich.table import Table

        done = m["step"] - (self.first_step or m["step"]) + 1
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(done, 1) * (m["total_steps"] - m["step"])
        tokens_s = m.get("tokens", 0) / max(m["per_step_time"], 1) * 1000
        t = Table.grid(padding=(0, 2))
        t.add_row(f"[bold]step[/] {m['step']}/{m['total_steps']}", f"[bold]loss[/] {m['loss']:.4f}",
                  f"[bold]tokens/s[/] {tokens_s:,.0f}", f"[bold]ETA[/] {eta:,.0f}s")
        phases = "  ".join(f"{k[5:-3]} {v:,.0f}ms" for k, v in m.items() if k.startswith("time_"))
        t.add_row(f"[dim]{phases}[/]", "", "", "")
        return t

    def on_step(self, metrics: dict[str, Any]) -> None:
        if not self.console.is_terminal:
            return
        if self.first_step is None:
            self.first_step, self.t0 = metrics["step"], time.perf_counter() - metrics["per_step_time"] / 1000
        from rich.live import Live

        if self.live is None:
            self.live = Live(self._table(metrics), console=self.console, transient=True, auto_refresh=False)
            self.live.start()
        self.live.update(self._table(metrics), refresh=True)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        pass

    def on_checkpoint(self, step: int, path: str) -> None:
        pass

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
