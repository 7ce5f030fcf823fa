"""Pure derived values (mftk.derive): data_path and split parsing against the reference's rules and vectors."""
from __future__ import annotations

import pytest

from mftk.derive import Blend, DeriveError, parse_data_path, parse_split


@pytest.mark.parametrize("data_path, expected", [
    (["1", "p"], Blend(("p",), (1.0,))),
    (["p", "q"], Blend(("p", "q"), None)),
    (["30", "p", "70", "q"], Blend(("p", "q"), (30.0, 70.0))),
    ([0.3, " a ", 0.7, "b"], Blend(("a", "b"), (0.3, 0.7))),
    (["a", "b", "c"], Blend(("a", "b", "c"), None)),
    ("only", Blend(("only",), None)),
])
def test_parse_data_path(data_path, expected):
    assert parse_data_path(data_path) == expected


@pytest.mark.parametrize("data_path, match, index", [
    ([], "is empty", None),
    (["0.5", "a", "b", "c"], "mixes weights and prefixes", 2),
    (["-1", "a", "2", "b"], "must be a number > 0", 0),
    (["0", "a", "0", "b"], "must be a number > 0", 0),
    (["1", "a", "0", "b"], "weight '0' of b", 2),
    (["nan", "a", "1", "b"], "must be a number > 0", 0),
    (["1", "a", "2", "3"], "is not a dataset prefix", 3),
    ([1, 2], "is not a dataset prefix", 1),
    (["0.5", "a", "0.5"], "need an even length", None),  # the reference would read "0.5" as a prefix
])
def test_parse_data_path_errors(data_path, match, index):
    with pytest.raises(DeriveError, match=match) as info:
        parse_data_path(data_path)
    assert info.value.index == index


@pytest.mark.parametrize("split, shares", [
    ("1, 0, 0", [1.0, 0.0, 0.0]),
    ("0.7,0.2,0.1", [0.7000000000000001, 0.20000000000000004, 0.10000000000000002]),  # Python's sum, as MF
    ("99,1", [0.99, 0.01, 0.0]),
])
def test_parse_split(split, shares):
    assert parse_split(split) == shares


@pytest.mark.parametrize("split, match", [
    ("", "does not parse"), ("abc", "does not parse"), ("1,2,3,4", "at most 3"),
    ("0,0,0", "sums to 0"), ("-1, 2", "does not parse"), ("1..2", "does not parse"), (None, "is required"),
    ("0, 1, 0", "training split no data"),
])
def test_split_errors(split, match):
    with pytest.raises(DeriveError, match=match):
        parse_split(split)


@pytest.mark.parametrize("params, one_process, want", [
    (10_000_000, True, True), (9_999_999, True, False), (10 ** 9, False, False)])
def test_compiles_blocks_from_ten_million_parameters_in_one_process(params, one_process, want):
    """The trainer's and the planner's shared rule: msrun workers stay eager (TP/CP communicate inside a layer)."""
    from mftk.derive import compiles_blocks

    assert compiles_blocks(params, one_process=one_process) is want
