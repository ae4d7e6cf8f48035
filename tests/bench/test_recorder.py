"""The benchmark recorder on a fake clock: interleaving order, warm-up on the timed inputs, ratios taken
within a round (so a machine that slows down between rounds does not move them), spreads, `Fresh` state."""

import types

import pytest
import torch

from multispec.bench import recorder
from multispec.bench.recorder import Fresh, Recorder, format_table, partition, repeat


class FakeClock:
    """`perf_counter` that only advances when a method says it spent time."""

    def __init__(self):
        self.now = 0.0
        self.slowdown = 1.0

    def perf_counter(self):
        return self.now

    def spend(self, seconds):
        self.now += seconds * self.slowdown


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(recorder, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def _method(clock, calls, name, seconds, tokens=4):
    def run(ids):
        calls.append((name, int(ids[0, 0])))
        clock.spend(seconds)
        return torch.cat([ids, torch.zeros(1, tokens, dtype=ids.dtype)], dim=1)
    return run


def test_methods_interleave_per_input_after_a_warm_up_on_a_timed_input(clock):
    calls = []
    methods = {"a": _method(clock, calls, "a", 1.0), "plain": _method(clock, calls, "plain", 2.0)}
    inputs = [torch.tensor([[7]]), torch.tensor([[8]])]
    Recorder(methods, "plain").run(repeat(inputs, 2))
    warm, timed = calls[:2], calls[2:]
    assert sorted(warm) == [("a", 7), ("plain", 7)]
    # the baseline first for every input, then the others: plain, a, plain, a, ... in both rounds
    assert timed == [("plain", 7), ("a", 7), ("plain", 8), ("a", 8)] * 2


def test_ratios_are_taken_within_a_round_and_a_slower_round_does_not_move_them(clock):
    calls = []
    methods = {"plain": _method(clock, calls, "plain", 2.0), "a": _method(clock, calls, "a", 1.0),
               "b": _method(clock, calls, "b", 4.0)}
    rec = Recorder(methods, "plain", also_against=["b"])
    inputs = [torch.tensor([[1]])]

    def slow_second_round(name, ids, out):  # the machine slows 3x after the first round
        if name == "b" and len(calls) >= 6:
            clock.slowdown = 3.0
    rec.observe = slow_second_round
    table = rec.run(repeat(inputs, 3))
    a = table["methods"]["a"]
    assert a["speedup_rounds"] == [2.0, 2.0, 2.0] and a["speedup"] == 2.0 and a["speedup_spread"] == [2.0, 2.0]
    assert a["speedup_vs_b"] == 4.0
    assert table["methods"]["b"]["speedup"] == 0.5
    assert table["methods"]["plain"]["tokens"] == 12  # 4 new tokens x 3 rounds


def test_the_spread_is_the_range_of_per_round_ratios(clock):
    costs = iter([2.0, 1.0, 2.0, 0.5, 2.0, 2.0])  # (plain, a) per round: ratios 2, 4, 1

    def plain(ids):
        clock.spend(next(costs))
        return torch.cat([ids, ids], dim=1)
    rec = Recorder({"plain": plain, "a": plain}, "plain")
    table = rec.run(repeat([torch.tensor([[1]])], 3), warmup=[])  # no warm-up: it would consume the costs
    row = table["methods"]["a"]
    assert row["speedup_rounds"] == [2.0, 4.0, 1.0]
    assert row["speedup"] == 2.0 and row["speedup_spread"] == [1.0, 4.0]


def test_fresh_methods_start_over_every_round_and_for_the_warm_up(clock):
    made = []

    def make():
        state = []
        made.append(state)

        def run(ids):
            state.append(int(ids[0, 0]))
            clock.spend(1.0)
            return ids
        return run
    methods = {"plain": lambda ids: (clock.spend(1.0), ids)[1], "learner": Fresh(make)}
    inputs = [torch.tensor([[1]]), torch.tensor([[2]])]
    Recorder(methods, "plain").run(repeat(inputs, 2))
    assert made == [[1], [1, 2], [1, 2]]  # warm-up (first input), round 1, round 2: each starts afresh


def test_outputs_are_compared_with_the_baseline_for_the_same_input(clock):
    methods = {"plain": lambda ids: ids + 1, "same": lambda ids: ids + 1, "off": lambda ids: ids + 2}

    def compare(ref, out, ids):
        return "identical" if torch.equal(ref, out) else "mismatch"
    table = Recorder(methods, "plain", compare=compare, count=lambda i, o: 1).run(
        repeat([torch.tensor([[1]]), torch.tensor([[5]])], 2))
    assert table["methods"]["same"]["outputs"] == {"identical": 4}
    assert table["methods"]["off"]["outputs"] == {"mismatch": 4}
    assert "outputs" not in table["methods"]["plain"]
    assert recorder.outputs_identical({"t": table}) is False
    assert "speedup [spread]" in format_table("greedy", table)


def test_partition_and_repeat_and_bad_arguments():
    assert partition(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert partition([1, 2], 5) == [[1], [2]]
    assert repeat([1, 2], 2) == [[1, 2], [1, 2]]
    with pytest.raises(ValueError, match="rounds"):
        partition([1], 0)
    with pytest.raises(ValueError, match="baseline"):
        Recorder({"a": lambda x: x}, "plain")
    with pytest.raises(ValueError, match="also_against"):
        Recorder({"plain": lambda x: x}, "plain", also_against=["hf"])
    with pytest.raises(ValueError, match="rounds"):
        Recorder({"plain": lambda x: x}, "plain").run([[]])


def test_ctrl_c_prints_the_rounds_measured_so_far_and_goes_on(clock, capsys):
    """An interrupt in round 3 of 3: the two finished rounds print as a table, then the interrupt propagates (the
    CLI ends quietly on it: tests/core/test_errors.py)."""
    calls = []
    methods = {"plain": _method(clock, calls, "plain", 2.0), "a": _method(clock, calls, "a", 1.0)}
    count = {"n": 0}

    def interrupt_in_round_three(name, ids, out):
        count["n"] += 1
        if count["n"] == 5:  # the first call of round 3 (two calls a round)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Recorder(methods, "plain", observe=interrupt_in_round_three).run(repeat([torch.tensor([[1]])], 3),
                                                                         desc="greedy", progress=False)
    printed = capsys.readouterr().out
    assert "greedy: interrupted after 2 of 3 rounds" in printed and "2.00x" in printed
