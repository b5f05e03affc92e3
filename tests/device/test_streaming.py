"""Weight-streaming budget parsing and resolution (pyrt.streaming): pure integer logic."""

from __future__ import annotations

import logging
import math
import random
import re
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from pyrt.errors import BudgetError
from pyrt.streaming import (
    MAX_BUDGET_BYTES,
    BudgetSpec,
    BudgetWarning,
    EngineStreamingInfo,
    LoadBudget,
    ResolvedBudget,
    find_baked_budget,
    parse_budget,
    parse_compile_spec_budget,
    parse_load_budget,
    resolve_budgets,
    split_proportionally,
)

SRC = "load-time budget (test)"
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


def _bytes(n: int) -> BudgetSpec:
    return BudgetSpec("bytes", n)


def _share(num: int, den: int = 1) -> BudgetSpec:
    return BudgetSpec("share", Fraction(num, den))


# --------------------------------------------------------------------------- parse_budget

@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("auto", BudgetSpec("auto")), ("AUTO", BudgetSpec("auto")), (" Auto\t", BudgetSpec("auto")),
    (0, _bytes(0)), (123, _bytes(123)), (MAX_BUDGET_BYTES, _bytes(MAX_BUDGET_BYTES)),
    (np.int64(77), _bytes(77)), (np.uint8(3), _bytes(3)),
    ("0", _bytes(0)), ("123", _bytes(123)), ("123B", _bytes(123)), ("123b", _bytes(123)),
    (" 2 GiB ", _bytes(2 * GiB)), ("2gib", _bytes(2 * GiB)), ("2GIB", _bytes(2 * GiB)),
    ("512MB", _bytes(512 * 10**6)), ("512mb", _bytes(512 * 10**6)),
    ("1kB", _bytes(1000)), ("1KB", _bytes(1000)), ("1KiB", _bytes(KiB)), ("3MiB", _bytes(3 * MiB)),
    ("1TB", _bytes(10**12)), ("1TiB", _bytes(TiB)), ("7GB", _bytes(7 * 10**9)),
    ("1.5GB", _bytes(1_500_000_000)), ("1.5GiB", _bytes(3 * GiB // 2)), ("0.5KiB", _bytes(512)),
    ("2.000B", _bytes(2)), ("007", _bytes(7)),
    (str(MAX_BUDGET_BYTES), _bytes(MAX_BUDGET_BYTES)), ("8388608TiB", _bytes(MAX_BUDGET_BYTES)),
    (0.5, _share(1, 2)), (0.3, _share(3, 10)), (1.0, _share(1)), (1e-300, _share(1, 10**300)),
    (np.float64(0.25), _share(1, 4)),
    ("50%", _share(1, 2)), ("100%", _share(1)), ("12.5%", _share(1, 8)),
    ("0.001%", _share(1, 100_000)), (" 50 % ", _share(1, 2)),
])
def test_parse_budget_accepts(value: object, expected: BudgetSpec | None) -> None:
    assert parse_budget(value, source=SRC) == expected


def test_parse_budget_passes_a_spec_through() -> None:
    spec = _share(1, 4)
    assert parse_budget(spec, source=SRC) is spec


@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_empty_string_is_ignored_with_a_log_line(value: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pyrt.streaming"):
        assert parse_budget(value, source=SRC) is None
    [record] = [r for r in caplog.records if r.name == "pyrt.streaming"]
    assert SRC in record.getMessage() and repr(value) in record.getMessage()


BAD_BUDGETS: list[tuple[object, str]] = [
    (True, "bool"), (False, "bool"), (np.int64(-3), "negative"),
    (-1, "negative"), (MAX_BUDGET_BYTES + 1, "2**63"), (10**40, "2**63"),
    (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"),
    (0.0, "(0, 1]"), (-0.0, "(0, 1]"), (-0.5, "(0, 1]"), (1.0000001, "(0, 1]"),
    (2.0, "pass an int"), (1.5, "(0, 1]"),
    ("0%", "(0, 100]"), ("101%", "(0, 100]"), ("100.01%", "(0, 100]"), ("-5%", "negative"),
    ("-5", "negative"), ("-5GB", "negative"),
    ("1.5B", "whole number"), ("0.1KiB", "whole number"), ("0.5", "whole number"),
    (str(MAX_BUDGET_BYTES + 1), "2**63"), ("8388609TiB", "2**63"),
    ("1e9", "unit"), ("2G", "unit"), ("2 GB extra", "unit"), ("abc", "unit"), ("auto2", "unit"),
    ("1,000", "unit"), ("1_000", "unit"), ("+5", "unit"), (".5GB", "unit"), ("5.GB", "unit"),
    ("%50", "unit"), ("50%%", "unit"), ("GB", "unit"), ("\u0661\u0662", "unit"), ("\u00bd", "unit"),
    ("1" * 2000, "characters"),
    (b"123", "unsupported type"), ([1], "unsupported type"), (Fraction(1, 2), "unsupported type"),
    (Decimal("1"), "unsupported type"), (np.float32(0.5), "unsupported type"),
    ({"a": 1}, "unsupported type"),
]


@pytest.mark.parametrize("value, why", BAD_BUDGETS)
def test_parse_budget_rejects_naming_value_and_source(value: object, why: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_budget(value, source=SRC)
    message = str(info.value)
    assert SRC in message and why in message
    assert repr(value)[:150] in message


# --------------------------------------------------------------------------- BudgetSpec

@pytest.mark.parametrize("spec, text", [
    (BudgetSpec("auto"), "auto"), (_bytes(0), "0B"), (_bytes(1023), "1023B"),
    (_bytes(1024), "1KiB"), (_bytes(1000), "1kB"), (_bytes(3 * GiB), "3GiB"),
    (_bytes(1_500_000_000), "1500MB"), (_bytes(5 * TiB), "5TiB"), (_bytes(MAX_BUDGET_BYTES), "8388608TiB"),
    (_share(1), "100%"), (_share(1, 8), "12.5%"), (_share(3, 10), "30%"), (_share(1, 1000), "0.1%"),
])
def test_spec_str(spec: BudgetSpec, text: str) -> None:
    assert str(spec) == text
    assert parse_budget(text, source=SRC) == spec


@pytest.mark.parametrize("kind, value", [
    ("share", Fraction(1, 3)), ("share", Fraction(0)), ("share", Fraction(3, 2)), ("share", 0.5),
    ("bytes", -1), ("bytes", True), ("bytes", MAX_BUDGET_BYTES + 1), ("bytes", 1.0),
    ("auto", 5), ("kilo", 1), ("bytes", None),
])
def test_spec_rejects_invalid_fields(kind: str, value: object) -> None:
    with pytest.raises(BudgetError, match="BudgetSpec"):
        BudgetSpec(kind, value)  # type: ignore[arg-type]


byte_counts = st.one_of(st.integers(0, 2**20), st.integers(0, MAX_BUDGET_BYTES),
                        st.sampled_from([KiB, MiB, GiB, TiB, 10**9, MAX_BUDGET_BYTES]).flatmap(
                            lambda m: st.integers(0, MAX_BUDGET_BYTES // m).map(lambda k: k * m)))
decimal_shares = st.builds(lambda num, k: Fraction(num, 10**k), st.integers(1, 10**12),
                           st.integers(0, 12)).filter(lambda f: f <= 1)
specs = st.one_of(st.just(BudgetSpec("auto")), byte_counts.map(_bytes),
                  decimal_shares.map(lambda f: BudgetSpec("share", f)))


@given(specs)
def test_formatting_then_parsing_is_identity(spec: BudgetSpec) -> None:
    assert parse_budget(str(spec), source=SRC) == spec


@given(st.floats(min_value=0, max_value=1, exclude_min=True, allow_subnormal=True))
@example(5e-324)
@example(0.1)
def test_float_shares_are_their_shortest_repr_and_round_trip(f: float) -> None:
    spec = parse_budget(f, source=SRC)
    assert spec == BudgetSpec("share", Fraction(repr(f)))
    assert float(spec.value) == f  # the decimal reading names the same double
    assert parse_budget(str(spec), source=SRC) == spec


@given(st.integers(0, 10**6), st.sampled_from(["B", "kB", "MB", "GB", "KiB", "MiB", "GiB", "TiB"]),
       st.booleans())
def test_unit_strings_multiply_exactly(n: int, unit: str, lower: bool) -> None:
    mult = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9,
            "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}[unit]
    text = f"{n}{unit.lower() if lower else unit}"
    assert parse_budget(text, source=SRC) == _bytes(n * mult)


# --------------------------------------------------------------------------- compile spec

@pytest.mark.parametrize("raw, expected", [
    (b"0", 0), (b"123", 123), ("123", 123), (bytearray(b"7"), 7), (memoryview(b"8"), 8),
    (b"0009", 9), (b"0" * 100 + b"1", 1), (str(MAX_BUDGET_BYTES).encode(), MAX_BUDGET_BYTES),
    (np.frombuffer(b"42", dtype=np.uint8).tobytes(), 42),
])
def test_compile_spec_accepts(raw: object, expected: int) -> None:
    assert parse_compile_spec_budget(raw, source=SRC) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("raw, why", [
    (b"", "digits"), (b" 1", "digits"), (b"1 ", "digits"), (b"-1", "digits"), (b"+1", "digits"),
    (b"1.5", "digits"), (b"1e3", "digits"), (b"1GiB", "digits"), (b"\xff", "digits"),
    ("\u0661", "digits"), ("", "digits"), (b"auto", "digits"),
    (str(MAX_BUDGET_BYTES + 1).encode(), "2**63"), (b"9" * 20, "2**63"), (b"9" * 5000, "2**63"),
    (12, "unsupported type"), (None, "unsupported type"),
])
def test_compile_spec_rejects_naming_value_and_source(raw: object, why: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_compile_spec_budget(raw, source=SRC)  # type: ignore[arg-type]
    message = str(info.value)
    assert SRC in message and why in message and repr(raw)[:150] in message


def test_find_baked_budget() -> None:
    assert find_baked_budget([], source="delegate 0") is None
    assert find_baked_budget([("target_device", b"cuda:0")], source="delegate 0") is None
    specs = [("target_device", b"cuda:0"), ("weight_streaming_budget", b"4096")]
    assert find_baked_budget(specs, source="delegate 0") == 4096


def test_find_baked_budget_rejects_duplicates_and_bad_values() -> None:
    dup = [("weight_streaming_budget", b"1"), ("weight_streaming_budget", b"1")]
    with pytest.raises(BudgetError, match=r"delegate 3: .*'weight_streaming_budget'.* 2 times"):
        find_baked_budget(dup, source="delegate 3")
    with pytest.raises(BudgetError, match=r"delegate 4 compile spec weight_streaming_budget.*b'x'"):
        find_baked_budget([("weight_streaming_budget", b"x")], source="delegate 4")


# --------------------------------------------------------------------------- split_proportionally

def reference_split(total: int, weights: list[int]) -> list[int]:
    """Independent Hamilton apportionment over Fractions (slow but obviously right)."""
    whole = sum(weights)
    total = min(total, whole)
    if whole == 0:
        return [0] * len(weights)
    quotas = [Fraction(total * w, whole) for w in weights]
    parts = [math.floor(q) for q in quotas]
    ranked = sorted(range(len(weights)), key=lambda i: (quotas[i] - parts[i], -i), reverse=True)
    for i in ranked[: total - sum(parts)]:
        parts[i] += 1
    return parts


@pytest.mark.parametrize("total, weights, expected", [
    (0, [1, 2], [0, 0]), (5, [], []), (5, [0, 0], [0, 0]), (10, [30, 30, 30], [4, 3, 3]),
    (1, [1, 1], [1, 0]), (2, [1, 1, 1], [1, 1, 0]), (2, [0, 5, 5], [0, 1, 1]),
    (100, [30, 10], [30, 10]), (3, [2, 0, 1], [2, 0, 1]), (7, [1, 2, 4], [1, 2, 4]),
])
def test_split_table(total: int, weights: list[int], expected: list[int]) -> None:
    assert split_proportionally(total, weights) == expected == reference_split(total, weights)


@pytest.mark.parametrize("total, weights, name", [
    (-1, [1], "total"), (True, [1], "total"), (1.0, [1], "total"),
    (1, [1, -1], r"weights\[1\]"), (1, [1.5], r"weights\[0\]"), (1, [False], r"weights\[0\]"),
])
def test_split_rejects_bad_arguments(total: object, weights: list[object], name: str) -> None:
    with pytest.raises(BudgetError, match=name):
        split_proportionally(total, weights)  # type: ignore[arg-type]


def test_numpy_ints_count_and_the_arithmetic_stays_on_plain_ints() -> None:
    """Numpy ints are ints (:func:`pyrt.checks.is_int`); what the budget code keeps of them is a plain int,
    so no sum or product of budgets runs in int64."""
    parts = split_proportionally(np.int64(10), [np.int64(30), np.int64(30), np.int64(30)])
    assert parts == [4, 3, 3] and {type(p) for p in parts} == {int}
    info = EngineStreamingInfo(np.int64(0), streamable_bytes=np.int64(1 << 20), baked=np.uint64(5))
    assert (type(info.delegate_index), type(info.streamable_bytes), type(info.baked)) == (int, int, int)
    assert type(BudgetSpec("bytes", np.int32(7)).value) is int
    assert [type(k) for k in parse_load_budget({np.int64(1): "1GiB"}, source=SRC).engines] == [int]


weights_lists = st.lists(st.one_of(st.integers(0, 50), st.integers(0, 2**40)), max_size=8)


@given(st.integers(0, 2**42), weights_lists)
def test_split_properties(total: int, weights: list[int]) -> None:
    parts = split_proportionally(total, weights)
    whole = sum(weights)
    assert sum(parts) == min(total, whole)
    assert all(0 <= p <= w for p, w in zip(parts, weights, strict=True))
    if whole:
        exact = [Fraction(min(total, whole) * w, whole) for w in weights]
        assert all(abs(p - q) < 1 for p, q in zip(parts, exact, strict=True))
    assert parts == reference_split(total, weights)


@given(st.integers(0, 2**42), st.integers(0, 2**42), weights_lists)
def test_split_is_monotone_within_one_byte(t1: int, t2: int, weights: list[int]) -> None:
    lo, hi = sorted((t1, t2))
    small, large = split_proportionally(lo, weights), split_proportionally(hi, weights)
    assert sum(small) <= sum(large)
    assert all(b >= a - 1 for a, b in zip(small, large, strict=True))


def test_split_alabama_paradox_costs_at_most_one_byte() -> None:
    """Largest remainder is not strictly monotone per part; find a case, check it is 1 byte."""
    rng = random.Random(1234)
    found = None
    for _ in range(20_000):
        weights = [rng.randint(1, 30) for _ in range(3)]
        total = rng.randint(0, sum(weights) - 1)
        a, b = split_proportionally(total, weights), split_proportionally(total + 1, weights)
        if any(y < x for x, y in zip(a, b, strict=True)):
            found = (a, b)
            break
    assert found is not None, "expected the Alabama paradox to show up for 3 parts"
    a, b = found
    assert min(y - x for x, y in zip(a, b, strict=True)) == -1 and sum(b) == sum(a) + 1


@given(st.integers(1, 2**40), st.integers(1, 6), st.integers(0, 2**41))
def test_split_ties_favour_lower_positions(w: int, n: int, total: int) -> None:
    parts = split_proportionally(total, [w] * n)
    assert parts == sorted(parts, reverse=True) and max(parts) - min(parts) <= 1


# --------------------------------------------------------------------------- resolve_budgets

def _decide(results: list[ResolvedBudget]) -> list[tuple[int | None, str]]:
    return [(r.budget, r.source) for r in results]


def _quiet(engines: list[EngineStreamingInfo], load_time: object = None, **kw: object) -> list[ResolvedBudget]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return resolve_budgets(engines, load_time, **kw)  # type: ignore[arg-type]


E0 = EngineStreamingInfo(0, 300)
E1 = EngineStreamingInfo(1, 100, baked=40)
EMPTY = EngineStreamingInfo(2, 0)


@pytest.mark.parametrize("load_time, expected", [
    (None, [(None, "automatic"), (40, "baked"), (None, "none")]),
    ("", [(None, "automatic"), (40, "baked"), (None, "none")]),
    ("auto", [(None, "automatic"), (None, "automatic"), (None, "none")]),
    (200, [(150, "load-time"), (50, "load-time"), (None, "none")]),
    ("0B", [(0, "load-time"), (0, "load-time"), (None, "none")]),
    ("400B", [(300, "load-time"), (100, "load-time"), (None, "none")]),
    (0.5, [(150, "load-time"), (50, "load-time"), (None, "none")]),
    ("33.3%", [(99, "load-time"), (33, "load-time"), (None, "none")]),
    ({}, [(None, "automatic"), (40, "baked"), (None, "none")]),
    ({0: "10%"}, [(30, "load-time"), (40, "baked"), (None, "none")]),
    ({1: None, 0: 7}, [(7, "load-time"), (40, "baked"), (None, "none")]),
    ({1: "auto"}, [(None, "automatic"), (None, "automatic"), (None, "none")]),
    ({0: 250, 1: "1%"}, [(250, "load-time"), (1, "load-time"), (None, "none")]),
    ({2: "auto"}, [(None, "automatic"), (40, "baked"), (None, "none")]),
])
def test_resolve_table(load_time: object, expected: list[tuple[int | None, str]]) -> None:
    assert _decide(_quiet([E0, E1, EMPTY], load_time)) == expected


def test_resolve_keeps_input_order_and_fields() -> None:
    results = _quiet([EMPTY, E1, E0], 200)
    assert results == [ResolvedBudget(2, 0, None, "none"), ResolvedBudget(1, 100, 50, "load-time"),
                       ResolvedBudget(0, 300, 150, "load-time")]


def test_total_above_program_streamable_clamps_with_warning() -> None:
    with pytest.warns(BudgetWarning, match=r"load-time budget: total of 401 bytes .* 400 ") as rec:
        results = resolve_budgets([E0, E1, EMPTY], 401)
    assert _decide(results)[:2] == [(300, "load-time"), (100, "load-time")]
    assert len(rec) == 1 and rec[0].filename == __file__  # points at the caller, not pyrt


def test_per_engine_bytes_above_streamable_clamp_with_warning() -> None:
    with pytest.warns(BudgetWarning, match="for delegate 1: budget of 101 bytes"):
        results = resolve_budgets([E0, E1], {1: "101B"})
    assert _decide(results) == [(None, "automatic"), (100, "load-time")]


def test_baked_above_streamable_clamps_with_warning() -> None:
    with pytest.warns(BudgetWarning, match="delegate 5 baked: budget of 999 bytes"):
        [result] = resolve_budgets([EngineStreamingInfo(5, 10, baked=999)])
    assert (result.budget, result.source) == (10, "baked")


@pytest.mark.parametrize("load_time, match", [
    ({2: 5}, r"for delegate 2: budget 5B ignored"), ({2: "1%"}, "for delegate 2: budget 1% ignored"),
])
def test_explicit_budget_on_engine_without_streamable_weights_warns(load_time: object,
                                                                    match: str) -> None:
    with pytest.warns(BudgetWarning, match=match) as rec:
        results = resolve_budgets([E0, E1, EMPTY], load_time)  # type: ignore[arg-type]
    assert results[2] == ResolvedBudget(2, 0, None, "none") and len(rec) == 1


def test_baked_budget_on_engine_without_streamable_weights_warns() -> None:
    with pytest.warns(BudgetWarning, match="delegate 4: baked budget of 8 bytes ignored"):
        [result] = resolve_budgets([EngineStreamingInfo(4, 0, baked=8)])
    assert result == ResolvedBudget(4, 0, None, "none")


@pytest.mark.parametrize("load_time", [5, "1GiB", 0.5, "10%", "0B"])
def test_budget_on_program_with_nothing_streamable_warns_once(load_time: object) -> None:
    with pytest.warns(BudgetWarning, match="the program has no streamable weights") as rec:
        results = resolve_budgets([EngineStreamingInfo(0, 0), EngineStreamingInfo(1, 0)], load_time)
    assert len(rec) == 1
    assert all(r.source == "none" and r.budget is None for r in results)


def test_auto_or_nothing_on_program_with_nothing_streamable_is_silent() -> None:
    engines = [EngineStreamingInfo(0, 0), EngineStreamingInfo(1, 0)]
    assert _decide(_quiet(engines, "auto")) == _decide(_quiet(engines)) == [(None, "none")] * 2
    assert _quiet([], None) == [] and _quiet([], "auto") == []


@pytest.mark.parametrize("mapping, shown", [
    ({7: 1}, "7"), ({-1: 1}, "-1"), ({True: 1}, "True"), ({"0": 1}, "'0'"), ({0.0: 1}, "0.0"),
])
def test_mapping_with_unknown_delegate_names_index_and_valid_ones(mapping: dict[object, object],
                                                                 shown: str) -> None:
    with pytest.raises(BudgetError) as info:
        resolve_budgets([E1, E0, EMPTY], mapping)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"index {shown};" in message and "[0, 1, 2]" in message


def test_mapping_values_are_parsed_with_a_per_delegate_source() -> None:
    with pytest.raises(BudgetError, match=r"load-time budget for delegate 1: .* 'lots'"):
        resolve_budgets([E0, E1], {1: "lots"})
    with pytest.raises(BudgetError, match=r"load-time budget for delegate 0: .* \{0: 1\}"):
        resolve_budgets([E0, E1], {0: {0: 1}})  # type: ignore[dict-item]


def test_bad_program_wide_value_names_source() -> None:
    with pytest.raises(BudgetError, match=r"^my option: invalid weight-streaming budget -2:"):
        resolve_budgets([E0], -2, source="my option")


def test_duplicate_delegate_indices_rejected() -> None:
    with pytest.raises(BudgetError, match=r"duplicate delegate indices in \[0, 0\]"):
        resolve_budgets([E0, EngineStreamingInfo(0, 5)])


# --------------------------------------------------------------------------- parse_load_budget

@pytest.mark.parametrize("value, expected", [
    (None, LoadBudget()), ("", LoadBudget()), ("fit", LoadBudget("fit")), (" Fit ", LoadBudget("fit")),
    ("auto", LoadBudget("auto", BudgetSpec("auto"))), (200, LoadBudget("bytes", _bytes(200))),
    ("50%", LoadBudget("share", _share(1, 2))), ({}, LoadBudget("per-engine")),
    ({3: "1KiB", 0: None}, LoadBudget("per-engine", engines={3: _bytes(KiB), 0: None})),
])
def test_parse_load_budget_reads_every_form_once(value: object, expected: LoadBudget) -> None:
    assert parse_load_budget(value, source=SRC) == expected
    assert parse_load_budget(expected, source=SRC) is expected  # already read: as is


@pytest.mark.parametrize("value, match", [
    ({-1: 1}, r"engine index -1 is not a non-negative int"), ({"0": 1}, r"engine index '0' is not"),
    ({True: 1}, r"engine index True is not"), ({0: "fit"}, r"for delegate 0: invalid .* 'fit'"),
    ("lots", r"invalid weight-streaming budget 'lots'"),
])
def test_parse_load_budget_names_the_value_and_its_source(value: object, match: str) -> None:
    with pytest.raises(BudgetError, match=rf"^{re.escape(SRC)}.*{match}"):
        parse_load_budget(value, source=SRC)


@pytest.mark.parametrize("kind, spec, engines", [
    ("bytes", None, {}), ("auto", _bytes(1), {}), ("none", _bytes(1), {}), ("fit", None, {0: None}),
])
def test_load_budget_refuses_a_spec_or_engines_its_kind_cannot_have(kind: str, spec: object, engines: dict) -> None:
    with pytest.raises(BudgetError, match="LoadBudget"):
        LoadBudget(kind, spec, engines)  # type: ignore[arg-type]


@pytest.mark.parametrize("load_time", [None, "auto", 200, "0B", 0.5, {0: "10%"}, {1: None, 0: 7}])
def test_resolve_takes_the_read_value_as_it_takes_the_written_one(load_time: object) -> None:
    parsed = parse_load_budget(load_time, source="load-time budget")
    assert _quiet([E0, E1, EMPTY], parsed) == _quiet([E0, E1, EMPTY], load_time)


def test_fit_applies_the_planned_split_with_its_own_source() -> None:
    results = _quiet([E0, E1, EMPTY], LoadBudget("fit"), planned={0: 120, 1: 30})
    assert _decide(results) == [(120, "fit"), (30, "fit"), (None, "none")]
    with pytest.raises(BudgetError, match=r"^set_budget: budget 'fit' needs the memory plan's split"):
        resolve_budgets([E0], "fit", source="set_budget")


@pytest.mark.parametrize("fields", [
    (-1, 5, None), (True, 5, None), (0, -5, None), (0, 5.0, None), (0, False, None),
    (0, 5, -1), (0, 5, MAX_BUDGET_BYTES + 1), (0, 5, True), (0, 5, "5"),
])
def test_engine_info_rejects_bad_fields(fields: tuple[object, object, object]) -> None:
    with pytest.raises(BudgetError, match="EngineStreamingInfo"):
        EngineStreamingInfo(*fields)  # type: ignore[arg-type]


engine_lists = st.lists(st.tuples(st.integers(0, 2**36), st.none() | st.integers(0, 2**37)),
                        max_size=6).map(
    lambda rows: [EngineStreamingInfo(i, s, b) for i, (s, b) in enumerate(rows)])


@given(engine_lists, st.integers(0, 2**20), st.randoms(use_true_random=False))
def test_resolve_total_properties(engines: list[EngineStreamingInfo], frac: int,
                                  rnd: random.Random) -> None:
    streamable = sum(e.streamable_bytes for e in engines)
    assume(streamable > 0)  # else the budget is ignored with a warning (tested above)
    total = streamable * frac // 2**20  # at most streamable: no clamp, so no warning
    results = _quiet(engines, total)
    assert sum(r.budget or 0 for r in results) == total
    for e, r in zip(engines, results, strict=True):
        assert (r.delegate_index, r.streamable_bytes) == (e.delegate_index, e.streamable_bytes)
        if e.streamable_bytes:
            assert r.source == "load-time" and 0 <= r.budget <= e.streamable_bytes  # type: ignore[operator]
            assert abs(r.budget - Fraction(total * e.streamable_bytes, streamable)) < 1  # type: ignore[operator]
        else:
            assert (r.budget, r.source) == (None, "none")
    shuffled = engines[:]
    rnd.shuffle(shuffled)
    by_index = {r.delegate_index: r for r in results}
    assert {r.delegate_index: r for r in _quiet(shuffled, total)} == by_index


@given(engine_lists, decimal_shares)
def test_resolve_share_is_floor_of_each_engines_own_size(engines: list[EngineStreamingInfo],
                                                        share: Fraction) -> None:
    assume(any(e.streamable_bytes for e in engines))
    results = _quiet(engines, BudgetSpec("share", share))
    for e, r in zip(engines, results, strict=True):
        if e.streamable_bytes:
            assert r.budget == math.floor(share * e.streamable_bytes) and r.source == "load-time"
        else:
            assert r.source == "none"


@given(engine_lists)
def test_resolve_without_load_time_uses_baked_clamped_else_automatic(
        engines: list[EngineStreamingInfo]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = resolve_budgets(engines)
    expected_warnings = 0
    for e, r in zip(engines, results, strict=True):
        if e.streamable_bytes == 0:
            assert (r.budget, r.source) == (None, "none")
            expected_warnings += e.baked is not None
        elif e.baked is None:
            assert (r.budget, r.source) == (None, "automatic")
        else:
            assert (r.budget, r.source) == (min(e.baked, e.streamable_bytes), "baked")
            expected_warnings += e.baked > e.streamable_bytes
    assert len(caught) == expected_warnings
    assert all(issubclass(w.category, BudgetWarning) for w in caught)


@given(engine_lists, st.integers(1, 2**40))
def test_resolve_total_above_streamable_gives_every_engine_its_all(
        engines: list[EngineStreamingInfo], excess: int) -> None:
    streamable = sum(e.streamable_bytes for e in engines)
    assume(streamable > 0)
    with pytest.warns(BudgetWarning, match="exceeds the program's"):
        results = resolve_budgets(engines, streamable + excess)
    assert [r.budget for r in results] == [e.streamable_bytes or None for e in engines]
