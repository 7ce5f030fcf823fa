"""gigatoken's tokenizer, loaded and called with the least Python around it: `from_json`, and
`encode_batch_arrays`, its batch ids as two numpy arrays without importing `awkward`.

`from_json`: the `gigatoken` package's Python layer (``gigatoken.Tokenizer``, which imports
multiprocessing, its HF and tiktoken compatibility wrappers...) costs 30 ms of a 0.6 s
`mftk preprocess` run over 50 MB, on the path that waits for the tokenizer, and all mftk calls is
the compiled tokenizer's ``encode_batch``. Where the package is not imported yet, its compiled
module is loaded alone (under its own name, so a later ``import gigatoken`` finds it loaded and
shares it) and the tokenizer is its Rust object, called as ``gigatoken.Tokenizer.encode_batch``
calls it: in parallel except in a forked child or a multiprocessing worker (`_may_run_parallel`,
gigatoken's own rule, since a thread pool made before a fork has no threads after it). Where the
package is imported already, or the compiled module is not where the package keeps it, the
package's ``Tokenizer`` is used as before; the ids are the same either way.

`encode_batch_arrays`:
gigatoken's ``encode_batch`` builds its result by calling ``awkward.unflatten(ids, counts)`` on
two numpy arrays it has already made (and reads ``awkward.Array`` to test whether its input is an
awkward array). Importing `awkward` costs 0.2-0.3 CPU-seconds (it pulls in fsspec, asyncio, ssl,
regex, importlib.metadata...), a quarter of a whole `mftk preprocess` run over 50 MB, and all mftk
wants back is those two arrays. So, while `awkward` is not imported, each batch runs with a
stand-in module under that name (`_STAND_IN`: an ``Array`` no input is an instance of, and an
``unflatten`` that returns the arrays as given), for the duration of the call only.

Safety: the stand-in is only in ``sys.modules`` while calls of ours run (a count under a lock puts it
there and takes it away; concurrent calls share it), never once the real `awkward` is loaded, and
what it returns is checked (two 1-D integer arrays whose counts add up to the ids, one count per
input). Should a gigatoken version ask the stand-in for anything else, or return something else,
the call is made again with the real `awkward` and the stand-in is not used again in the process;
the ids are the same either way, since the stand-in only receives them.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import threading
import types

import numpy as np

_LOCK = threading.Lock()
_RUST_MODULE = "gigatoken.gigatoken_rs"
_rust: list[types.ModuleType] = []  # the compiled module once loaded alone
_forked = [False]  # set in the child of any fork after this module is imported (`_may_run_parallel`)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forked.__setitem__(0, True))


def installed() -> bool:
    """Whether gigatoken can be imported (without importing it)."""
    return "gigatoken" in sys.modules or importlib.util.find_spec("gigatoken") is not None


def from_json(tokenizer_json: bytes):
    """gigatoken's tokenizer for these ``tokenizer.json`` bytes: something with gigatoken's
    ``encode_batch(texts)``. Raises ImportError if gigatoken is not installed, and what gigatoken
    raises for a tokenizer it cannot load."""
    rust = _rust_module()
    if rust is None:
        import gigatoken

        return gigatoken.Tokenizer.from_json(tokenizer_json)
    return _Direct(rust.load_hf_json(tokenizer_json))


def warm_up(tokenizer) -> None:
    """Encode one short text now, so that the tokenizer's one-time set-up for encoding (~20 ms, on its
    first encode, with the GIL released) runs on the thread that loaded it, beside the rest of the
    command's start-up, rather than in front of the run's first chunk. Any failure is left for the
    run's own encodes and the backend check to meet and report."""
    try:
        encode_batch_arrays(tokenizer.encode_batch, ["warm up"])
    except Exception:  # noqa: BLE001 - see above: nothing is decided here
        pass


class _Direct:
    """gigatoken's Rust tokenizer, with ``encode_batch`` as ``gigatoken.Tokenizer`` calls it."""

    __slots__ = ("backend",)

    def __init__(self, backend: object) -> None:
        self.backend = backend

    def encode_batch(self, texts: list):
        return self.backend.encode_batch(texts, parallel=_may_run_parallel())


def _rust_module() -> types.ModuleType | None:
    """gigatoken's compiled module, loaded without the package; None where the package is imported
    already or does not hold the module where 0.10 keeps it. ImportError: gigatoken is not installed."""
    if "gigatoken" in sys.modules:
        return None
    if _rust:
        return _rust[0]
    package = importlib.util.find_spec("gigatoken")
    if package is None:
        raise ImportError("No module named 'gigatoken'", name="gigatoken")
    found = importlib.machinery.PathFinder.find_spec("gigatoken_rs", package.submodule_search_locations or [])
    if found is None or not isinstance(found.loader, importlib.machinery.ExtensionFileLoader):
        return None
    loader = importlib.machinery.ExtensionFileLoader(_RUST_MODULE, found.origin)
    spec = importlib.util.spec_from_file_location(_RUST_MODULE, found.origin, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if not hasattr(module, "load_hf_json"):
        return None
    _rust.append(module)  # not in sys.modules: the package, if imported later, is imported as usual
    return module


def _may_run_parallel() -> bool:
    """gigatoken's rule for ``parallel=None``: not in a forked child nor a multiprocessing worker."""
    if _forked[0]:
        return False
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None


class StandInUnusable(Exception):
    """gigatoken asked the stand-in for something it does not provide, or returned something else."""


class _FlatIds:
    """What ``awkward.unflatten(ids, counts)`` receives: kept as the two arrays."""

    __slots__ = ("ids", "counts")

    def __init__(self, ids: object, counts: object) -> None:
        self.ids, self.counts = ids, counts


class _NeverAnInput:
    """``awkward.Array`` for gigatoken's input test: our inputs are lists, never awkward arrays."""


class _AwkwardStandIn(types.ModuleType):
    Array = _NeverAnInput

    @staticmethod
    def unflatten(ids: object, counts: object, *args: object, **kwargs: object) -> _FlatIds:
        if args or kwargs:
            raise StandInUnusable("unflatten called with more than (ids, counts)")
        return _FlatIds(ids, counts)

    def __getattr__(self, name: str) -> object:
        raise StandInUnusable(f"gigatoken asked awkward for {name!r}")


_STAND_IN = _AwkwardStandIn("awkward", "mftk's stand-in for awkward inside gigatoken's encode_batch")
_state = {"usable": True, "calls": 0}  # calls: encodes running with the stand-in in sys.modules


def encode_batch_arrays(encode_batch, texts: list, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, int64 count per text) of ``encode_batch(texts, **kwargs)``, gigatoken's batch encode."""
    if _state["usable"] and sys.modules.get("awkward", _STAND_IN) is _STAND_IN:
        try:
            return _with_stand_in(encode_batch, texts, kwargs)
        except Exception:  # noqa: BLE001 - a tokenizer failure raises again below, with the real awkward
            _state["usable"] = False
    return _flat(encode_batch(texts, **kwargs))


def _with_stand_in(encode_batch, texts: list, kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    with _LOCK:
        real = sys.modules.get("awkward", _STAND_IN) is not _STAND_IN  # the real one, imported meanwhile: use it
        if not real:
            sys.modules["awkward"] = _STAND_IN
            _state["calls"] += 1
    if real:
        return _flat(encode_batch(texts, **kwargs))
    try:
        result = encode_batch(texts, **kwargs)
    finally:
        with _LOCK:
            _state["calls"] -= 1
            if not _state["calls"] and sys.modules.get("awkward") is _STAND_IN:
                del sys.modules["awkward"]
    if not isinstance(result, _FlatIds):
        raise StandInUnusable(f"encode_batch returned {type(result).__name__}")
    ids, counts = result.ids, result.counts
    if not (isinstance(ids, np.ndarray) and isinstance(counts, np.ndarray) and ids.ndim == counts.ndim == 1
            and ids.dtype.kind in "ui" and counts.dtype.kind in "ui" and len(counts) == len(texts)
            and int(counts.sum()) == len(ids)):
        raise StandInUnusable("unflatten received arrays of another shape")
    return ids, counts.astype(np.int64, copy=False)


def _flat(array) -> tuple[np.ndarray, np.ndarray]:
    """(content, lengths) of an awkward list array: zero-copy views in the usual offsets layout."""
    layout = array.layout
    offsets = getattr(layout, "offsets", None)
    content = getattr(getattr(layout, "content", None), "data", None)
    if offsets is not None and isinstance(content, np.ndarray) and not hasattr(layout, "mask"):
        off = np.asarray(offsets.data, dtype=np.int64)
        return content[off[0]:off[-1]], np.diff(off)
    import awkward as ak  # any other layout: let awkward flatten it

    return ak.to_numpy(ak.flatten(array, axis=1)), ak.to_numpy(ak.num(array, axis=1)).astype(np.int64)
