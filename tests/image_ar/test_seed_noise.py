"""The image scores' own noise: a spread over runs that differ only in their seeds, and a difference counted as
a quality change only beyond twice that spread."""

import pytest

from multispec.image_ar.metrics import beyond_noise, seed_spread


def test_seed_spread_and_what_it_lets_a_claim_say():
    runs = [{"fid": 104.2, "class_accuracy": 0.994}, {"fid": 108.7, "class_accuracy": 0.990},
            {"fid": 106.0, "class_accuracy": 0.992}]
    spread = seed_spread(runs)
    assert spread["fid"]["spread"] == pytest.approx(4.5) and spread["fid"]["mean"] == pytest.approx(106.3)
    assert spread["class_accuracy"]["spread"] == pytest.approx(0.004)
    # the review's case: LANTERN's FID 93 vs AR's 108.7 is 15.7 apart, beyond 2 x 4.5; 100.0 is 8.7 apart, inside
    assert beyond_noise({"fid": 93.0, "class_accuracy": 0.961}, runs[1], spread) == {"fid": True, "class_accuracy": True}
    assert beyond_noise({"fid": 100.0, "class_accuracy": 0.989}, runs[1], spread) == {"fid": False, "class_accuracy": False}
    assert "precision" not in spread  # scores the runs lack are left out, not made up
    with pytest.raises(ValueError, match="runs"):
        seed_spread(runs[:1])
