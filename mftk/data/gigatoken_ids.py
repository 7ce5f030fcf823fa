"""gigatoken's batch ids as two numpy arrays, without importing `awkward` where that can be avoided.

gigatoken's ``encode_batch`` builds its result by calling ``awkward.unflatten(ids, counts)`` on
two numpy arrays it has already made (and reads ``awkward.Array`` to test whether its input is an
awkward array). Importing `awkward` costs 0.2-0.3 CPU-seconds (it pulls in fsspec, asyncio, ssl,
regex, importlib.metadata...), a quarter of a whole `mftk preprocess` run over 50 MB, and all mftk
wants back is those two arrays. So, while `awkward` is not imported, each batch runs with a
stand-in module under that name (`_STAND_IN`: an ``Array`` no input is an instance of, and an
``unflatten`` that returns the arrays as given), for the duration of the call only.

Safety: the stand-in is only in ``sys.modules`` while one of our calls runs (a lock makes the
calls take turns), never once the real `awkward` is loaded, and what it returns is checked (two
1-D integer arrays whose counts add up to the ids, one count per input). Should a gigatoken version
ask the stand-in for anything else, or return something else, the call is made again with the real
`awkward` and the stand-in is not used again in the process; the ids are the same either way,
since the stand-in only receives them.
"""
from __future__ import annotations

import sys
import threading
import types

import numpy as np

_LOCK = threading.Lock()


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
_state = {"usable": True}


def encode_batch_arrays(encode_batch, texts: list, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, int64 count per text) of ``encode_batch(texts, **kwargs)``, gigatoken's batch encode."""
    if _state["usable"] and "awkward" not in sys.modules:
        try:
            return _with_stand_in(encode_batch, texts, kwargs)
        except Exception:  # noqa: BLE001 - a tokenizer failure raises again below, with the real awkward
            _state["usable"] = False
    return _flat(encode_batch(texts, **kwargs))


def _with_stand_in(encode_batch, texts: list, kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    with _LOCK:
        if "awkward" in sys.modules:  # imported by someone else meanwhile: use it
            return _flat(encode_batch(texts, **kwargs))
        sys.modules["awkward"] = _STAND_IN
        try:
            result = encode_batch(texts, **kwargs)
        finally:
            if sys.modules.get("awkward") is _STAND_IN:
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
