"""Every library error type has a row in the CLI's error table, and the codes are the documented ones."""
from __future__ import annotations

import inspect

from commands import _errors
from mftk import errors as E


def test_every_error_class_has_a_row():
    classes = [c for _, c in inspect.getmembers(E, inspect.isclass)
               if issubclass(c, E.MftkError) and c is not E.MftkError]
    table_types = [t for t, _, _ in _errors.TABLE]
    assert classes, "no error classes found"
    missing = [c.__name__ for c in classes if c not in table_types]
    assert missing == []


def test_subclasses_come_before_their_bases():
    types_ = [t for t, _, _ in _errors.TABLE]
    for i, t in enumerate(types_):
        for later in types_[i + 1:]:
            assert not issubclass(later, t) or later is t, f"{later.__name__} is shadowed by {t.__name__}"


def test_documented_exit_codes():
    assert _errors.exit_code_for(E.ConfigError(message="x")) == 1
    assert _errors.exit_code_for(E.InputError(message="x")) == 2
    assert _errors.exit_code_for(E.NotBuiltError(message="x")) == 2
    assert _errors.exit_code_for(E.AnomaliesFound(message="x")) == 3
    assert _errors.exit_code_for(E.TrainingError(message="x")) == 4
    assert _errors.exit_code_for(E.TrainingInterrupted(message="x")) == 75
    assert _errors.exit_code_for(KeyboardInterrupt()) == 130
    assert _errors.exit_code_for(ValueError("bug")) is None
