"""The shipped zoo stays under DESIGN.md's 100 MB (it ships inside the package)."""

from multispec.zoo import WEIGHTS


def test_the_shipped_weights_stay_under_100_mb():
    total = sum(f.stat().st_size for f in WEIGHTS.rglob("*") if f.is_file())
    assert 0 < total < 100e6, f"{total / 1e6:.2f} MB shipped"
