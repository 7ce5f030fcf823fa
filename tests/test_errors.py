"""Every library error type has a row in the CLI's error table, and the codes are the documented ones."""
from __future__ import annotations

import inspect

import pytest

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
    assert _errors.exit_code_for(E.JobFault(message="x", kind="hang", ranks=[1])) == 4
    assert _errors.exit_code_for(E.TrainingInterrupted(message="x")) == 75
    assert _errors.exit_code_for(KeyboardInterrupt()) == 130
    assert _errors.exit_code_for(ValueError("bug")) is None


def test_errors_take_keyword_fields_with_their_defaults():
    """The errors' interface: keyword-only fields, defaults, the message as str(), mutable defaults not shared."""
    e = E.DataFormatError(message="bad line", path="c.jsonl", line=3)
    assert (str(e), e.hint, e.path, e.line, e.offset, e.expected, e.found) == ("bad line", "", "c.jsonl", 3, None, "", "")
    assert repr(e) == ("DataFormatError(message='bad line', hint='', path='c.jsonl', line=3, offset=None, "
                       "expected='', found='')")
    a, b = E.ConfigError(message="a"), E.ConfigError(message="b")
    a.problems.append(E.Problem(path="x", message="y"))
    assert b.problems == [] and E.PlanError(message="p").values == {} and E.AnomaliesFound(message="q").kinds == []
    assert a != E.ConfigError(message="a", problems=list(a.problems))  # exceptions compare by identity
    assert E.Problem(path="x", message="y") == E.Problem(path="x", message="y") != E.Problem(path="x", message="z")
    with pytest.raises(TypeError):
        E.InputError("positional message")
    with pytest.raises(TypeError):
        E.InputError(message="m", line=3)  # not one of its fields


def test_a_worker_error_is_rebuilt_by_its_parent(tmp_path):
    """A worker writes its typed error as JSON (`as_dict`); the parent raises the same type with the same fields."""
    from mftk.engine.launch import _read_error, _write_error

    problem = E.Problem(path="model.hidden_size", message="must be divisible", value=7, line=12, hint="use 8")
    for err in (E.ConfigError(message="bad config", hint="fix it", problems=[problem], source="x.yaml"),
                E.TrainingInterrupted(message="stopped", step=5, saved_path="ckpt/5"),
                E.DataFormatError(message="bad", path="p", line=2, offset=9, expected="a", found="b")):
        _write_error(tmp_path / "err.json", err)
        back = _read_error(tmp_path / "err.json")
        assert type(back) is type(err) and back.as_dict() == err.as_dict()
    assert back.line == 2 and _read_error(tmp_path / "missing.json") is None
    assert E.ConfigError(message="m", problems=[problem]).as_dict()["problems"] == [
        {"path": "model.hidden_size", "message": "must be divisible", "value": 7, "line": 12, "hint": "use 8",
         "severity": "error"}]
