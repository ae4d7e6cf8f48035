"""The runnable examples (code blocks marked `<!-- runnable -->`) of README.md and docs/*.md run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"<!-- runnable -->\s*```python\n(.*?)```", flags=re.S)
BLOCKS = [(page.relative_to(ROOT).as_posix(), i, code)
          for page in PAGES for i, code in enumerate(RUNNABLE.findall(page.read_text()))]


def test_the_readme_has_an_example_per_modality():
    readme = "\n".join(code for page, _, code in BLOCKS if page == "README.md")
    assert sum(page == "README.md" for page, _, _ in BLOCKS) >= 5
    for marker in ("speculative_generate", "stdlib-mamba2", "multispec.vision", "multispec.image_ar",
                   "multispec.reasoning"):
        assert marker in readme, f"README.md has no runnable example using {marker}"


@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_example_runs(page, index, code):
    exec(compile(code, f"{page} example {index}", "exec"), {"__name__": "docs_example"})
