"""The documentation points at things that exist: every repository path quoted in README.md and docs/*.md,
every relative link and its anchor, BENCHMARKS.md's index and its results files; README.md stays short."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATHLIKE = re.compile(r"^[\w.\-/*<>]+$")  # one token: no spaces, calls, options or operators
PATH_SUFFIXES = (".py", ".json", ".md", ".toml")


def prose(text: str) -> str:
    """The text outside fenced code blocks (commands there hold user paths such as ./my-llava)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def quoted_paths(page: Path) -> list[str]:
    """Backticked tokens that name repository paths. Skipped, each for a stated reason: URLs and `~/...`
    (not in the repository); all-capital segments such as `D/K/N` (option placeholders). Globs and `<name>`
    placeholders are kept and must match at least one path (see `exists`)."""
    found = []
    for token in INLINE.findall(prose(page.read_text())):
        token = token.strip()
        if not PATHLIKE.match(token) or not ("/" in token or token.endswith(PATH_SUFFIXES)):
            continue
        if token.startswith(("http://", "https://", "~/")):
            continue
        if all(re.fullmatch(r"[A-Z]+", part) for part in token.strip("/").split("/")):
            continue
        found.append(token)
    return found


SOURCE_DIRS = ("multispec", "ssm", "vision", "image_ar", "reasoning", "demos", "benchmarks", "tests", "docs")


def exists(token: str) -> bool:
    """A path from the repository root; a bare file name (`cli.py`: the file every modality package has)
    must name a file in at least one source folder; globs and `<name>` placeholders must match a path."""
    pattern = re.sub(r"<[^>]*>", "*", token).rstrip("/")
    if "/" not in pattern:
        return (ROOT / pattern).exists() or any(any((ROOT / d).rglob(pattern)) for d in SOURCE_DIRS)
    if any(c in pattern for c in "*?["):
        return any(ROOT.glob(pattern))
    return (ROOT / pattern).exists()


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; keep it at most 250 (the rest goes in docs/)"


def test_docs_pages_exist():
    names = {p.name for p in DOCS}
    assert {"core.md", "ssm.md", "vision.md", "image_ar.md", "reasoning.md", "design.md", "cli.md"} <= names


def test_every_quoted_path_exists():
    checked, missing = 0, []
    for page in PAGES:
        for token in quoted_paths(page):
            checked += 1
            if not exists(token):
                missing.append(f"{page.relative_to(ROOT)}: `{token}`")
    assert checked >= 80, f"only {checked} quoted paths found: the path pattern no longer matches the docs"
    assert not missing, "quoted paths that do not exist:\n" + "\n".join(missing)


def test_the_readme_quotes_paths_too():
    assert len(quoted_paths(README)) >= 8


def test_relative_links_and_anchors_resolve():
    checked, broken = 0, []
    for page in [*PAGES, BENCHMARKS]:
        for target in LINK.findall(prose(page.read_text())):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: ({target}): no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: ({target}): no heading with that anchor")
    assert checked >= 60, f"only {checked} links found"
    assert not broken, "\n".join(broken)


def test_python_blocks_in_the_docs_compile():
    blocks = 0
    for page in PAGES:
        for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)):
            compile(block, f"{page.name} block {i}", "exec")
            blocks += 1
    assert blocks >= 12


def benchmarks_index() -> list[str]:
    text = BENCHMARKS.read_text()
    headings = [m.start() for m in re.finditer(r"^## ", text, flags=re.M)]
    assert headings and text[headings[0]:].startswith("## Index"), "BENCHMARKS.md must open with '## Index'"
    end = headings[1] if len(headings) > 1 else len(text)
    rows = [line for line in text[headings[0]:end].splitlines() if line.startswith("| ")]
    return rows[1:]  # the header row; the separator starts with "| -"


def test_benchmarks_opens_with_an_index_whose_files_exist():
    rows = [r for r in benchmarks_index() if not r.startswith("| -")]
    assert len(rows) >= 20
    targets = anchors(BENCHMARKS)
    problems = []
    for row in rows:
        files = re.findall(r"`(benchmarks/results/[^`]+)`", row)
        scripts = re.findall(r"(benchmarks/\w+\.py)", row)
        links = re.findall(r"\]\(#([^)]+)\)", row)
        if not files:
            problems.append(f"no results file: {row[:80]}")
        problems += [f"missing results file {f}" for f in files if not (ROOT / f).is_file()]
        problems += [f"missing script {s}" for s in scripts if not (ROOT / s).is_file()]
        if not re.search(r"`(MULTISPEC_\w+=\S+ )?(multispec |python benchmarks/)", row):
            problems.append(f"no command: {row[:80]}")
        if len(links) != 1 or links[0] not in targets:
            problems.append(f"section link missing or broken: {links}")
    assert not problems, "\n".join(problems)


def test_every_results_file_and_script_benchmarks_cites_exists():
    text = BENCHMARKS.read_text()
    cited = set(re.findall(r"benchmarks/results/[\w.\-/]+\.json", text)) | set(re.findall(r"benchmarks/\w+\.py", text))
    assert len(cited) >= 30
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"BENCHMARKS.md cites files that do not exist: {missing}"


@pytest.mark.parametrize("page", [*PAGES], ids=lambda p: p.name)
def test_docs_carry_no_measured_speedups(page):
    """Figures live in BENCHMARKS.md (and README's results table): a speedup like '2.91x' elsewhere goes stale."""
    text = prose(page.read_text())
    if page == README:
        text = "\n".join(line for line in text.splitlines() if not line.startswith("| "))
    assert not re.findall(r"\b\d+\.\d+x\b", text)


def test_the_generated_report_is_what_its_stored_run_renders():
    """BENCHMARKS.md's `bench all` section, its plots and README's results summary are regenerated from one stored
    JSON (`multispec bench all`): they must be what that JSON renders now, so neither drifts from the run."""
    import json

    from multispec.bench import report

    text = BENCHMARKS.read_text()
    block = re.search(re.escape(report.BEGIN) + r"\n(.*?)\n" + re.escape(report.END), text, re.S)
    assert block, "BENCHMARKS.md has no `multispec bench all` section"
    stored = re.search(r"stored in `(benchmarks/results/[\w.\-]+\.json)`", block.group(1)).group(1)
    doc = json.loads((ROOT / stored).read_text())
    assert block.group(1).rstrip() == report.render_section(doc, stored, "benchmarks/plots").rstrip()
    for png in re.findall(r"\]\((benchmarks/plots/[\w\-]+\.png)\)", block.group(1)):
        assert (ROOT / png).is_file(), png
    summary = re.search(re.escape(report.SUMMARY_BEGIN) + r"\n(.*?)\n" + re.escape(report.SUMMARY_END),
                        README.read_text(), re.S)
    assert summary and summary.group(1).rstrip() == report.summary_table(doc).rstrip()
