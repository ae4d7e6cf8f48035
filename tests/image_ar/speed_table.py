"""The image benches' recorder table, checked the same way for LANTERN and continuous decoding."""

import statistics

import pytest


def check_speed_table(res: dict, names: set[str], rounds: int) -> dict:
    """The image bench's recorder table: every method timed in every round, one image per timed call,
    each speedup inside its own spread; returns its rows."""
    assert res["schema"] == "multispec.bench/1" and res["benchmark"] == "image-ar" and res["machine"]["git_commit"]
    table = res["tables"]["sampling"]
    assert table["baseline"] == "ar" and table["unit"] == "images" and table["round_inputs"] == "partition"
    assert table["rounds"] == rounds and sum(table["inputs_per_round"]) == res["settings"]["timing_images"]
    rows = table["methods"]
    assert names <= set(rows)
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["speedup_spread"] == [1.0, 1.0]
    for name, row in rows.items():
        assert row["images"] == res["settings"]["timing_images"] and row["images_per_s"] > 0, name
        assert len(row["speedup_rounds"]) == rounds
        lo, hi = row["speedup_spread"]
        assert lo <= row["speedup"] <= hi
        assert row["speedup"] == pytest.approx(statistics.median(row["speedup_rounds"]), abs=1e-3)
    return rows
