"""The full build's Parameters are freed once FSDP has cut them (`run._release_freed_memory`): they sit in
reference cycles, so only a full garbage collection frees them, and the interpreter's own may not run before
training (bench/memory.py's 220M fsdp2 run kept the 838 MiB build through every step)."""
from __future__ import annotations

import gc
import weakref

import pytest

from mftk.engine.models.build import build_model
from tests.helpers.models import make_qwen3

pytestmark = pytest.mark.engine


class _Row:
    trainable, expert, stages = True, False, (0,)

    def split_over(self, axis: str) -> bool:
        return axis == "fsdp"


class _Table(dict):
    def __missing__(self, key):
        return _Row()


def _groups():
    from mftk.engine.parallel.groups import AxisGroup

    one = AxisGroup(name="", ranks=(0,), rank=0)

    class G:
        fsdp = tp = dp_cp = one
    return G()


def test_release_frees_the_build_parameters_fsdp_replaced():
    from mftk.engine.parallel import fsdp
    from mftk.engine.run import _release_freed_memory

    model = build_model(make_qwen3(), seed=0)
    built = [weakref.ref(p) for p in model.trainable_params()]
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: what is freed, the call freed
    try:
        fsdp.apply_fsdp(model, _groups(), _Table(), sink=fsdp.GradSink())
        now = {id(p) for p in model.trainable_params()}
        replaced = [r for r in built if r() is None or id(r()) not in now]  # cut into new Parameters (rows)
        assert len(replaced) > len(built) // 2
        assert all(r() is not None for r in replaced)  # nothing refers to them but their cycles
        _release_freed_memory()
        assert [r for r in replaced if r() is not None] == []
    finally:
        if enabled:
            gc.enable()
