"""The documentation points at things that exist: every repository path quoted in README.md, docs/*.md and the
benchmark pages (docs/benchmarks/*.md), every relative link and its anchor; BENCHMARKS.md stays a short index of
those pages (with `multispec bench all`'s generated section); every results file under benchmarks/results/ is
cited by some page and every one a page cites exists; README.md stays short."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]  # prose: no measured figures outside README's results table
BENCH_PAGES = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))  # the figures, one page per modality
CHECKED = [*PAGES, *BENCH_PAGES]  # quoted paths, links and anchors
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_CITED = re.compile(r"benchmarks/results/[\w.\-/]+\.\w+")

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
    (not in the repository); all-capital segments such as `D/K/N` (option placeholders); a segment of digits
    after the first, as in `6/2/11` or `tree_4/4/15` (a tree shape: depth/top-k/nodes, in benchmark rows).
    Globs and `<name>` placeholders are kept and must match at least one path (see `exists`)."""
    found = []
    for token in INLINE.findall(prose(page.read_text())):
        token = token.strip()
        if not PATHLIKE.match(token) or not ("/" in token or token.endswith(PATH_SUFFIXES)):
            continue
        if token.startswith(("http://", "https://", "~/")):
            continue
        if all(re.fullmatch(r"[A-Z]+", part) for part in token.strip("/").split("/")):
            continue
        if any(part.isdigit() for part in token.split("/")[1:]):
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
    bench = {p.name for p in BENCH_PAGES}
    assert {"text.md", "vision.md", "image_ar.md", "reasoning.md", "ssm.md", "core.md", "gpu.md"} <= bench


def test_every_quoted_path_exists():
    checked, missing = 0, []
    for page in CHECKED:
        for token in quoted_paths(page):
            checked += 1
            if not exists(token):
                missing.append(f"{page.relative_to(ROOT)}: `{token}`")
    assert checked >= 200, f"only {checked} quoted paths found: the path pattern no longer matches the docs"
    assert not missing, "quoted paths that do not exist:\n" + "\n".join(missing)


def test_the_readme_quotes_paths_too():
    assert len(quoted_paths(README)) >= 8


def test_relative_links_and_anchors_resolve():
    checked, broken = 0, []
    for page in [*CHECKED, BENCHMARKS]:
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
    assert checked >= 120, f"only {checked} links found"
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


def test_benchmarks_is_a_short_index():
    lines = BENCHMARKS.read_text().splitlines()
    assert len(lines) < 300, f"BENCHMARKS.md has {len(lines)} lines; keep it under 300 (figures go on the pages)"


def test_benchmarks_opens_with_a_short_index_of_the_pages():
    """One short row per page or study, each linking one heading that exists; every page is in it."""
    rows = [r for r in benchmarks_index() if not r.startswith("| -")]
    assert len(rows) >= 15
    problems, linked = [], set()
    for row in rows:
        if len(row) > 200:
            problems.append(f"row over 200 characters ({len(row)}): {row[:80]}")
        links = LINK.findall(row)
        if len(links) != 1:
            problems.append(f"expected one link, found {links}: {row[:80]}")
            continue
        path, _, anchor = links[0].partition("#")
        dest = (ROOT / path).resolve() if path else BENCHMARKS
        linked.add(dest)
        if not dest.is_file() or (anchor and anchor not in anchors(dest)):
            problems.append(f"broken link {links[0]}")
    problems += [f"no index row links {p.relative_to(ROOT)}" for p in BENCH_PAGES if p.resolve() not in linked]
    assert not problems, "\n".join(problems)


def citing_pages() -> list[Path]:
    """The pages a results file may be cited by: BENCHMARKS.md, README.md and every page under docs/."""
    return [BENCHMARKS, README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_results_file_is_cited_by_a_page():
    """A results file no page cites is an orphan: cite it beside its figure, or delete it."""
    cited = set()
    for page in citing_pages():
        cited |= set(RESULTS_CITED.findall(page.read_text()))
    files = sorted(p.relative_to(ROOT).as_posix() for p in RESULTS.rglob("*") if p.is_file())
    assert len(files) >= 50
    orphans = [f for f in files if f not in cited]
    assert not orphans, "results files no page cites (cite them beside their figures, or delete them):\n" + \
        "\n".join(orphans)


def test_every_results_file_and_script_a_page_cites_exists():
    cited, missing = 0, []
    for page in citing_pages():
        text = page.read_text()
        for c in sorted(set(RESULTS_CITED.findall(text)) | set(re.findall(r"benchmarks/(?:\w+/)?\w+\.py", text))):
            cited += 1
            if not (ROOT / c).is_file():
                missing.append(f"{page.relative_to(ROOT)}: {c}")
    assert cited >= 100
    assert not missing, "pages cite files that do not exist:\n" + "\n".join(missing)


RESULTS_COMMENT = re.compile(r"^<!-- (benchmarks/results/[\w.\-/]+\.json): (.+?), (\d{4}-\d\d-\d\d \d\d:\d\d UTC), "
                             r"commit ([0-9a-f]{7,40})\b.*-->$")


@pytest.mark.parametrize("page", BENCH_PAGES, ids=lambda p: p.name)
def test_each_benchmark_page_names_its_tables_files_commands_and_how_to_read_them(page):
    """Every table rendered from a results JSON carries the comment naming its file (which exists), machine,
    date and commit; a page runs at least one command and points at "How to read these figures"."""
    text = page.read_text()
    comments = [line for line in text.splitlines() if line.startswith("<!-- benchmarks/results/")]
    assert comments, f"{page.name}: no table carries its results comment"
    bad = [c[:100] for c in comments
           if not RESULTS_COMMENT.match(c) or not (ROOT / RESULTS_COMMENT.match(c)[1]).is_file()]
    assert not bad, f"{page.name}: results comments without an existing file, machine, date and commit:\n" + \
        "\n".join(bad)
    assert re.search(r"`(MULTISPEC_\w+=\S+ )?(multispec |python benchmarks/)", text), f"{page.name}: no command"
    assert "BENCHMARKS.md#how-to-read-these-figures" in text


@pytest.mark.parametrize("page", [*PAGES], ids=lambda p: p.name)
def test_docs_carry_no_measured_speedups(page):
    """Figures live in BENCHMARKS.md and docs/benchmarks/ (and README's results table): a speedup like '2.91x'
    elsewhere goes stale."""
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


def test_the_headline_table_is_what_the_stored_results_render():
    """README's headline table is generated from benchmarks/results (`multispec.bench.headline`): each row the
    newest stored run of its row on the test split, with that run's machine and date, so a rerun supersedes an
    older figure and none goes stale. Mutation caught: a hand-edited figure, or a row left at an older run (the
    Token Recycling row said 1.33x from a single pass after the recorded run since gave 0.98x)."""
    from multispec.bench import headline

    block = re.search(re.escape(headline.BEGIN) + r"\n(.*?)\n" + re.escape(headline.END), README.read_text(), re.S)
    assert block, "README.md has no generated headline table"
    assert block.group(1).rstrip() == headline.render(ROOT / "benchmarks" / "results").rstrip()
    assert len(block.group(1).splitlines()) >= 2 + len(headline.HEADLINES) - 2  # (nearly) every headline found
