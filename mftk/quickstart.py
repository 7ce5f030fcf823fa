"""The quick-start's plan and its in-process stages: corpus, tokenizer, config, and the outputs check.

Why a plan object: every stage, the final listing and the test need the same paths, and the
commands the quick-start runs for stages 3-6 are exactly the `mftk ...` lines a newcomer would
type next, so they are built here once (relative to the work directory, where they run) and
shown as they are run. The stages that are mftk commands themselves run in the command layer
(`commands/quickstart.py`), as separate processes, so this module never prints or spawns.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import attrs
import yaml

from mftk.config.templates import TEMPLATES_DIR  # package data: installed with mftk
from mftk.data import example_corpus
from mftk.errors import InputError

MODELS = {"qwen3": "qwen3_tiny.yaml", "deepseek_v3": "deepseek_v3_tiny.yaml"}
# Enough steps for the loss to drop visibly (about 8.3 -> 6.5 for qwen3) in a few minutes on 2 cores;
# DeepSeek-V3's MoE + MTP step costs about three Qwen3 steps on CPU.
DEFAULT_STEPS = {"qwen3": 40, "deepseek_v3": 20}
DATA_NAME = "quickstart"  # preprocess writes data/quickstart_text_document.{bin,idx}


@attrs.frozen(kw_only=True)
class QuickstartPlan:
    """What the quick-start will do and where each output goes (paths relative to ``workdir``)."""

    workdir: Path
    model: str
    nproc: int
    steps: int
    resume_steps: int
    max_chars: int = example_corpus.DEFAULT_MAX_CHARS
    vocab_size: int = example_corpus.DEFAULT_VOCAB

    corpus = Path("data/corpus.jsonl")
    tokenizer = Path("data/tokenizer.json")
    data_prefix = Path(f"data/{DATA_NAME}_text_document")
    output_dir = Path("output")
    checkpoint_dir = Path("output/checkpoint")
    rank0_log = Path("output/log/rank_0/info.log")
    plot = Path("loss.png")

    @property
    def config(self) -> Path:
        return Path(f"{self.model}_quickstart.yaml")

    @property
    def seq_length(self) -> int:
        return int(_template(self.model).get("model", {}).get("seq_length", 0)) or 1

    @property
    def total_steps(self) -> int:
        return self.steps + self.resume_steps

    @property
    def save_every(self) -> int:
        """Four saves during training (save_max keeps the last three), so inspect-ckpt and the
        retention policy have something to show."""
        return max(1, self.steps // 4)

    def at(self, rel: Path) -> Path:
        """A plan path as seen from the caller's working directory."""
        return self.workdir / rel

    def iteration_dir(self, step: int) -> Path:
        return self.checkpoint_dir / f"iteration_{step:08d}"

    def commands(self) -> dict[str, list[str]]:
        """The mftk command lines of stages 3-6 (run from ``workdir``), keyed by verb."""
        cfg, launch = str(self.config), ["--nproc", str(self.nproc)]
        return {
            "preprocess": ["preprocess", "--input", str(self.corpus), "--tokenizer", str(self.tokenizer),
                           "--output-prefix", f"data/{DATA_NAME}", "--append-eod"],
            "validate-config": ["validate-config", cfg, "--world-size", str(self.nproc)],
            "plan-parallel": ["plan-parallel", cfg, "--world-size", str(self.nproc), "--top", "5"],
            "train": ["train", cfg, "--output-dir", str(self.output_dir), *launch],
            "inspect-ckpt": ["inspect-ckpt", str(self.iteration_dir(self.steps))],
            "resume": ["resume", cfg, "--from", str(self.checkpoint_dir), "--output-dir", str(self.output_dir),
                       "--set", f"training.steps={self.total_steps}", *launch],
            "parse-log": ["parse-log", str(self.rank0_log), "--plot", str(self.plot),
                          "--seq-length", str(self.seq_length)],
        }


def make_plan(workdir: str | os.PathLike, *, model: str, nproc: int, steps: int | None, resume_steps: int,
              max_chars: int | None = None, vocab_size: int | None = None) -> QuickstartPlan:
    """Check the options and create the work directory (an existing one is reused, stage by stage).

    ``steps=None`` takes the model's `DEFAULT_STEPS`; the other defaults live on `mftk quickstart`'s options."""
    if model not in MODELS:
        raise InputError(message=f"--model {model!r}: not a quick-start model", hint=f"one of: {', '.join(MODELS)}")
    steps = DEFAULT_STEPS[model] if steps is None else steps
    for name, value, low in (("--steps", steps, 2), ("--nproc", nproc, 1), ("--resume-steps", resume_steps, 1)):
        if value < low:
            raise InputError(message=f"{name} {value}: must be at least {low}")
    if not template_path(model).is_file():
        raise InputError(message=f"template {template_path(model)} is missing", path=str(template_path(model)),
                         hint="reinstall mftk: its templates are package data (mftk/templates/)")
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise InputError(message=f"--workdir {workdir}: exists and is not a directory", path=str(workdir),
                         hint="pick a new directory name")
    try:
        (workdir / "data").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(message=f"--workdir {workdir}: cannot create it ({exc.strerror})", path=str(workdir)) from None
    return QuickstartPlan(workdir=workdir, model=model, nproc=nproc, steps=steps, resume_steps=resume_steps,
                          max_chars=max_chars or example_corpus.DEFAULT_MAX_CHARS,
                          vocab_size=vocab_size or example_corpus.DEFAULT_VOCAB)


def template_path(model: str) -> Path:
    return TEMPLATES_DIR / MODELS[model]


# ------------------------------------------------------------------------------- stage 1-2


@attrs.frozen
class CorpusResult:
    path: Path
    documents: int
    chars: int
    bytes: int
    wall_s: float


@attrs.frozen
class TokenizerResult:
    path: Path
    vocab_size: int
    eod_token: str
    eod_id: int
    wall_s: float


def build_corpus(plan: QuickstartPlan) -> tuple[CorpusResult, list[dict]]:
    """Stage 1: JSON lines of Python's own documentation topics and standard-library sources."""
    started = time.perf_counter()
    docs = example_corpus.corpus_documents(plan.max_chars)
    path = example_corpus.write_corpus(docs, plan.at(plan.corpus))
    return CorpusResult(path=path, documents=len(docs), chars=sum(len(d["text"]) for d in docs),
                        bytes=path.stat().st_size, wall_s=time.perf_counter() - started), docs


def build_tokenizer(plan: QuickstartPlan, docs: list[dict]) -> TokenizerResult:
    """Stage 2: a byte-level BPE trained on the corpus, EOD ``<|endoftext|>`` as id 0."""
    from tokenizers import Tokenizer

    started = time.perf_counter()
    path = example_corpus.train_tokenizer(docs, plan.at(plan.tokenizer), plan.vocab_size)
    tok = Tokenizer.from_file(str(path))
    return TokenizerResult(path=path, vocab_size=tok.get_vocab_size(), eod_token=example_corpus.EOD,
                           eod_id=tok.token_to_id(example_corpus.EOD), wall_s=time.perf_counter() - started)


# ------------------------------------------------------------------------------- stage 4


def config_overrides(plan: QuickstartPlan, vocab_size: int, eod_id: int) -> list[str]:
    """`--set`-style overrides that point the template at the quick-start's data and outputs."""
    samples = plan.total_steps * _global_batch_size(plan)
    return [
        f"train_dataset.dataloader.config.data_path={json.dumps(['1', str(plan.data_prefix)])}",
        f"train_dataset.dataloader.config.eod={eod_id}",
        f"train_dataset.dataloader.sizes={json.dumps([max(samples, 1), 0, 0])}",
        f"model.vocab_size={vocab_size}",
        f"training.steps={plan.steps}",
        # A cosine decays over training.steps, so extending the target step on resume would make
        # the LR jump up; a constant LR after warm-up lets `resume` continue the same curve.
        "lr_scheduler.type=ConstantWarmUpLR",
        f"checkpoint.save_path={plan.checkpoint_dir}",
        f"checkpoint.save_interleaved_steps={plan.save_every}",
        "checkpoint.save_max=3",
    ]


def write_config(plan: QuickstartPlan, vocab_size: int, eod_id: int) -> Path:
    """Stage 4: the template with the overrides applied, checked by the config model, then written.

    Why through the loader: a template/override mistake fails here with the config model's own
    message, before any command runs, and the file written is exactly what was checked.
    """
    from mftk.config.load import apply_override, load_data

    template = template_path(plan.model)
    raw = yaml.safe_load(template.read_text(encoding="utf-8"))
    overrides = config_overrides(plan, vocab_size, eod_id)
    for item in overrides:
        apply_override(raw, item)
    load_data(raw, source=str(template), check_files=False, world_size=plan.nproc)
    header = (f"# Written by `mftk quickstart` from templates/{template.name}, with:\n"
              + "".join(f"#   --set {o}\n" for o in overrides)
              + "# Paths are relative to this directory: run the mftk commands from here.\n")
    path = plan.at(plan.config)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=False), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _global_batch_size(plan: QuickstartPlan) -> int:
    return int(_template(plan.model).get("training", {}).get("global_batch_size", 1))


def _template(model: str) -> dict:
    return yaml.safe_load(template_path(model).read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------- stage 5


def set_aside_previous_output(plan: QuickstartPlan) -> Path | None:
    """Move a previous run's ``output/`` to ``output.previous/`` (replacing an older one).

    Why: train appends to the rank logs and writes into the checkpoint root, so a second quick-start
    in the same directory would otherwise mix two runs' steps in one log and one checkpoint tree.
    Only the quick-start's own directory names are touched; the latest earlier run is kept.
    """
    import shutil

    out = plan.at(plan.output_dir)
    if not out.exists():
        return None
    previous = out.with_name(out.name + ".previous")
    if previous.exists():
        shutil.rmtree(previous)
    out.rename(previous)
    return previous


# ------------------------------------------------------------------------------- the end


@attrs.frozen
class Output:
    what: str
    path: Path
    bytes: int


def list_outputs(plan: QuickstartPlan) -> list[Output]:
    """Every artefact the quick-start leaves, with its size (0 for a missing one)."""
    rows = [("corpus (JSON lines)", plan.corpus), ("tokenizer", plan.tokenizer),
            ("tokens (.bin)", plan.data_prefix.with_suffix(".bin")),
            ("index (.idx)", plan.data_prefix.with_suffix(".idx")), ("config", plan.config),
            ("checkpoints", plan.checkpoint_dir), ("rank-0 log", plan.rank0_log), ("loss plot", plan.plot)]
    if plan.nproc > 1:
        rows.insert(-1, ("msrun worker logs", plan.output_dir / "msrun_log"))
    return [Output(what=what, path=plan.at(rel), bytes=_size(plan.at(rel))) for what, rel in rows]


def checkpoint_steps(plan: QuickstartPlan) -> list[int]:
    """Steps with a complete iteration dir under the checkpoint root, ascending."""
    root = plan.at(plan.checkpoint_dir)
    if not root.is_dir():
        return []
    return sorted(int(p.name.removeprefix("iteration_")) for p in root.glob("iteration_*")
                  if p.is_dir() and p.name.removeprefix("iteration_").isdigit())


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0
