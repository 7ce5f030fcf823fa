"""Progress and metric sinks: how library code reports without printing.

Library functions take ``progress=NULL_PROGRESS`` or ``sinks=(...)``; commands pass Rich
adapters, tests pass a ``RecordingSink``.
"""
from __future__ import annotations

from typing import Any, Protocol


class Progress(Protocol):
    def start(self, label: str, total: float | None = None) -> None: ...
    def advance(self, n: float = 1, **info: Any) -> None: ...
    def done(self) -> None: ...


class _NullProgress:
    def start(self, label: str, total: float | None = None) -> None:
        pass

    def advance(self, n: float = 1, **info: Any) -> None:
        pass

    def done(self) -> None:
        pass


NULL_PROGRESS: Progress = _NullProgress()


class StepSink(Protocol):
    def on_step(self, metrics: dict[str, Any]) -> None: ...
    def on_event(self, kind: str, data: dict[str, Any]) -> None: ...
    def on_checkpoint(self, step: int, path: str) -> None: ...
    def close(self) -> None: ...


class BaseSink:
    """A `StepSink` that ignores everything; subclasses override only what they use."""

    def on_step(self, metrics: dict[str, Any]) -> None:
        pass

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        pass

    def on_checkpoint(self, step: int, path: str) -> None:
        pass

    def close(self) -> None:
        pass


class FanOut:
    """Passes each call to several sinks, in order."""

    def __init__(self, *sinks: StepSink) -> None:
        self.sinks = list(sinks)

    def on_step(self, metrics: dict[str, Any]) -> None:
        for s in self.sinks:
            s.on_step(metrics)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        for s in self.sinks:
            s.on_event(kind, data)

    def on_checkpoint(self, step: int, path: str) -> None:
        for s in self.sinks:
            s.on_checkpoint(step, path)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


class RecordingSink:
    """Keeps everything it is told; used by tests instead of capturing output."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.checkpoints: list[tuple[int, str]] = []
        self.closed = False

    def on_step(self, metrics: dict[str, Any]) -> None:
        self.steps.append(dict(metrics))

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, dict(data)))

    def on_checkpoint(self, step: int, path: str) -> None:
        self.checkpoints.append((step, path))

    def close(self) -> None:
        self.closed = True
