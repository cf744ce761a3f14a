"""The docs/ pages and the references to them from the code.

* Every `docs/<page>.md#<anchor>` written in a .py, .cc or .h file of the repository must name an
  existing page and an anchor of it (a heading's slug, as GitHub renders it, or an explicit
  `<a id="...">` / `<a name="...">`).
* Links between the pages (`[text](page.md#anchor)`, `[text](#anchor)`) must resolve the same way.
* No code may cite the external specification by section number any more, neither as
  "spec" plus section sign and number nor as a bare section sign and number: every reference
  points at a docs/ anchor.
"""
import collections
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIPPED_DIRS = {".venv", "venv", "build", "third_party", ".git", "dist", "__pycache__",
                ".pytest_cache", ".hypothesis"}
SOURCE_SUFFIXES = {".py", ".cc", ".h"}

REFERENCE = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)#([A-Za-z0-9_-]+)")
MARKDOWN_LINK = re.compile(r"\]\(([A-Za-z0-9_.-]*\.md)?#([A-Za-z0-9_-]+)\)")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SPEC_CITATION = re.compile("spec \u00a7")   # the section sign, spelled out so this file passes
SECTION_REFERENCE = re.compile("\u00a7 ?[0-9]")


def source_files():
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") or part.startswith("bazel-")
               for part in relative.parts[:-1]):
            continue
        if path.suffix in SOURCE_SUFFIXES and path.is_file():
            yield path


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page):
    """All anchors of a markdown page (duplicate headings get -1, -2, ... as on GitHub)."""
    seen = collections.Counter()
    result = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            result.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
        result.update(EXPLICIT_ANCHOR.findall(line))
    return result


def test_slug_follows_github():
    assert slug("Logical to storage mapping") == "logical-to-storage-mapping"
    assert slug("Sort, dedup and bucket") == "sort-dedup-and-bucket"
    assert slug("CSR-wrapped COO buffers") == "csr-wrapped-coo-buffers"
    assert slug("Checkpoints (format `v2`)") == "checkpoints-format-v2"


def test_docs_pages_exist():
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"layout.md", "preprocessing.md", "optimizers.md", "checkpoints.md"} <= pages


def test_code_references_to_docs_resolve():
    problems = []
    count = 0
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in REFERENCE.finditer(text):
            count += 1
            page, anchor = DOCS / match.group(1), match.group(2)
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if not page.is_file():
                problems.append(f"{where}: docs/{match.group(1)} does not exist")
            elif anchor not in anchors(page):
                problems.append(f"{where}: docs/{match.group(1)} has no anchor '{anchor}'")
    assert not problems, "\n".join(problems)


def test_links_between_docs_pages_resolve():
    problems = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in MARKDOWN_LINK.finditer(text):
            target = DOCS / match.group(1) if match.group(1) else page
            if not target.is_file():
                problems.append(f"{page.name}: link to missing page {match.group(1)}")
            elif match.group(2) not in anchors(target):
                problems.append(f"{page.name}: {target.name} has no anchor '{match.group(2)}'")
    assert not problems, "\n".join(problems)


def test_no_section_citations_of_the_external_spec():
    citations = _lines_matching(SPEC_CITATION)
    assert not citations, f"{len(citations)} citations left:\n" + "\n".join(citations)


def _lines_matching(pattern):
    found = []
    for path in source_files():
        for number, line in enumerate(path.read_text(encoding="utf-8",
                                                     errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_bare_section_references():
    found = _lines_matching(SECTION_REFERENCE)
    assert not found, f"{len(found)} section references left:\n" + "\n".join(found)


TEST_PATH = re.compile(r"\btests/[A-Za-z0-9_/]+\.py\b")


def test_paths_of_test_files_named_in_markdown_exist():
    """Moving a test file must update the pages that name it (README, docs/, RELIABILITY.md)."""
    problems = []
    for page in sorted(ROOT.glob("*.md")) + sorted(DOCS.glob("*.md")):
        for match in TEST_PATH.finditer(page.read_text(encoding="utf-8")):
            if not (ROOT / match.group(0)).is_file():
                problems.append(f"{page.relative_to(ROOT)}: {match.group(0)} does not exist")
    assert not problems, "\n".join(problems)
