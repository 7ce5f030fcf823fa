"""Layering rules that keep `mftk --help` fast and the library silent."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_LIBRARY = {"typer", "rich", "click"}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, at module level) for every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, node.lineno, id(node) in top))
    return out


def test_library_never_imports_cli_modules_prints_or_exits():
    bad = []
    for path in (ROOT / "mftk").rglob("*.py"):
        if path.name == "__main__.py":
            continue
        for module, line, _ in _imports(path):
            if module.split(".")[0] in FORBIDDEN_IN_LIBRARY or module.startswith("commands"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"print", "exit"}:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}()")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "exit"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "sys"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls sys.exit()")
    assert bad == []


def test_mindspore_only_under_engine_and_engine_only_lazily():
    bad = []
    for path in list((ROOT / "mftk").rglob("*.py")) + list((ROOT / "commands").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        in_engine = rel.startswith("mftk/engine/")
        for module, line, top_level in _imports(path):
            if module.split(".")[0] == "mindspore" and not in_engine and top_level:
                bad.append(f"{rel}:{line} imports mindspore at module level")
            if module.startswith("mftk.engine") and not in_engine and top_level:
                bad.append(f"{rel}:{line} imports the engine at module level")
    assert bad == []


def test_help_loads_no_heavy_module():
    """Start-up time is measured in bench/cli_startup.py; here we pin its cause: no heavy imports."""
    code = ("import sys; sys.argv=['mftk','--help']\n"
            "from commands.app import app\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in HEAVY if m in sys.modules))")
    heavy = ["mindspore", "numpy", "safetensors", "tokenizers", "matplotlib", "yaml", "cattrs"]
    out = subprocess.run([sys.executable, "-c", f"HEAVY={heavy!r}\n" + code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "LOADED []" in out, out


def test_every_subcommand_help_works_without_mindspore():
    from commands.app import COMMANDS

    for _, cli_name, _ in COMMANDS:
        code = (f"import sys; sys.argv=['mftk','{cli_name}','--help']\n"
                "from commands.app import app\n"
                "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
                "print('MS', 'mindspore' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert "MS False" in out.stdout, cli_name


def test_a_mistyped_subcommand_gets_one_suggestion():
    """Click and Typer both append "Did you mean"; the message must say it once, naming the real command."""
    from commands.app import app
    from tests.helpers.cli import runner

    res = runner.invoke(app, ["validate-confg", "x.yaml"])
    assert res.exit_code == 2
    text = " ".join(res.output.replace("│", " ").split())
    assert text.count("Did you mean") == 1, text
    assert "Did you mean 'validate-config'?" in text, text


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_preprocess_loads_only_its_own_modules(tmp_path, backend):
    """`mftk preprocess` imports one command module and the data layer: never MindSpore, the engine, the
    plan or config model, pydantic or matplotlib, nor awkward (gigatoken's result type: mftk takes its arrays
    without it, `mftk.data.gigatoken_ids`), nor gigatoken's Python package (its compiled tokenizer is loaded
    alone; with ``--tokenizer-backend hf`` not that either), nor attrs (25-40 ms of every start-up: the errors are
    plain classes, the data layer's records msgspec Structs). With ``--json`` and stderr not a terminal nothing
    is drawn, so Rich is not imported either."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} with some words"}) + "\n" for i in range(50)))
    code = ("import os, sys\n"  # the command ends with os._exit (no teardown): report the modules there
            "real_exit = os._exit\n"
            "def _exit(code):\n"
            "    ids = sys.modules.get('mftk.data.gigatoken_ids')\n"
            "    print('RUST', bool(ids and ids._rust), flush=True)\n"
            "    print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in TOP or "
            "m.startswith(('mftk.', 'commands.'))), flush=True)\n"
            "    real_exit(code)\n"
            "os._exit = _exit\n"
            f"sys.argv = ['mftk', 'preprocess', '-i', {str(corpus)!r}, '-t', {str(ROOT / 'mftk' / 'templates' / 'data')!r}, "
            f"'-o', {str(tmp_path / 'o')!r}, '--tokenizer-backend', {backend!r}, '--json']\n"
            "from commands.entry import main\nmain()\n")
    top = ["mindspore", "pydantic", "matplotlib", "awkward", "gigatoken", "yaml", "cattrs", "safetensors", "rich",
           "typer", "click", "attr", "attrs"]
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE")}
    out = subprocess.run([sys.executable, "-c", f"TOP={top!r}\n" + code], capture_output=True, text=True, cwd=ROOT,
                         env=env)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout.rsplit("LOADED", 1)[1])  # noqa: S307 - a list literal printed by the child above
    # --json with stderr not a terminal: no table, no progress bar, so no Rich (commands._render, _errors); a
    # plain argv is parsed from the command's option table, so no Typer or Click either (commands.app)
    allowed = {"commands._plain", "commands._argspec", "commands.entry", "commands.preprocess"}
    assert {m for m in loaded if m.startswith("commands.")} == allowed
    mftk = {m for m in loaded if m.startswith("mftk.")}
    assert all(m.startswith("mftk.data.") or m in {"mftk.data", "mftk.errors", "mftk.files", "mftk.lock",
                                                     "mftk.progress"} for m in mftk), mftk
    assert "mftk.data.preprocess" in mftk
    heavy = {m.split(".")[0] for m in loaded if not m.startswith(("mftk.", "commands."))}
    assert heavy == set(), heavy
    assert ("RUST True" in out.stdout) == (backend == "auto"), out.stdout


def test_version():
    from typer.testing import CliRunner

    from commands.app import app
    from mftk import __version__

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and __version__ in r.stdout


# Which mftk packages each layer may import (at any depth, lazily too): arrows only run downwards.
BASE = {"mftk.errors", "mftk.derive", "mftk.progress", "mftk.files", "mftk.lock", "mftk.units"}  # the ground floor
LAYERS = {
    "mftk/derive.py": set(),                                     # pure helpers: nothing of mftk's
    "mftk/errors.py": set(),
    "mftk/progress.py": set(),
    "mftk/units.py": {"mftk.errors"},                            # counts, rates and sizes for people
    "mftk/files.py": {"mftk.errors"},
    "mftk/config/": {"mftk.config"} | BASE,
    "mftk/plan/": {"mftk.plan", "mftk.config"} | BASE,
    "mftk/data/": {"mftk.data", "mftk.config"} | BASE,
    "mftk/ckpt/": {"mftk.ckpt", "mftk.config"} | BASE,
    "mftk/logs/": {"mftk.logs"} | BASE,
}


def _mftk_imports(path: Path) -> list[tuple[str, int]]:
    """(mftk module, line) of every import; ``from mftk import x`` counts as ``mftk.x``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "mftk"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mftk":
            out += ([(f"mftk.{a.name}", node.lineno) for a in node.names] if node.module == "mftk"
                    else [(node.module, node.lineno)])
    return out


def test_layers_import_only_downwards():
    """Nothing in config/ imports plan/ or engine/; plan/ does not reach into config rules or the engine;
    ckpt/ owns checkpoint formats without the engine; derive.py imports nothing of mftk's."""
    bad = []
    for prefix, allowed in LAYERS.items():
        paths = [ROOT / prefix] if prefix.endswith(".py") else sorted((ROOT / prefix).rglob("*.py"))
        for path in paths:
            for module, line in _mftk_imports(path):
                if not any(module == a or module.startswith(a + ".") for a in allowed):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_one_family_table():
    """model_type → config class, spec builder and HF mapping come from config/families.py alone."""
    import importlib

    from mftk.config.families import FAMILIES, MODEL_TYPES
    from mftk.config.model import model_configs

    assert model_configs() == {mt: f.config_class for mt, f in MODEL_TYPES.items()}
    for family in FAMILIES:
        module, _, function = family.spec.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), family.spec
        mapping = family.hf_mapping()
        assert callable(mapping.hf_to_mf) and callable(mapping.mf_to_hf), family.hf
    sources = "\n".join(p.read_text() for p in (ROOT / "mftk").rglob("*.py") if p.name != "families.py")
    assert "import_module(f\"mftk.engine.models" not in sources and "FAMILY_SPEC_MODULES" not in sources


def test_tests_import_helpers_not_other_tests_or_bench():
    """Shared test code lives in tests/helpers/ (and fixtures in conftest.py); no test reads bench/."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for module, line, _ in _imports(path):
            parts = module.split(".")
            if parts[0] == "bench" or (parts[0] == "tests" and len(parts) > 2
                                      and (parts[-1].startswith("test_") or parts[-1] == "conftest")):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports (at any depth, lazily too); ``from pkg import name``
    counts as ``pkg.name`` where that is a module, and relative imports are resolved."""
    files = sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_circle_of_two():
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_engine_has_no_import_circle():
    """No module of mftk/engine imports (even lazily) one that imports it back: the trainer's parts are
    built by `trainer_build`, which the trainer imports, never the other way round."""
    graph = _import_graph("mftk.engine")
    assert "mftk.engine.trainer_build" in graph["mftk.engine.trainer"]  # the graph sees this package's imports
    assert _cycles(graph) == []
