"""The README's runnable examples (code blocks marked `<!-- runnable -->`) run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"<!-- runnable -->\s*```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_runnable_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    exec(compile(BLOCKS[index], f"README.md example {index}", "exec"), {"__name__": "readme_example"})
