"""Every reference to the design document resolves: `docs/DESIGN.md section N[.M]` names a
numbered heading that exists, `docs/DESIGN.md#anchor` (or a relative Markdown link to it) names
an anchor that exists, and plain-text citations spell the path `docs/DESIGN.md`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
SKIP_DIRS = {"runs", "__pycache__", "node_modules"}  # plus every dot-directory (.git, .venv ...)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".j2", ".txt", ".sh", ".cfg", ".ini",
                 ".json", ".mako", ".html"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
MAX_BYTES = 2_000_000

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # "# ..." in code is no heading
_NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s")
_ANCHOR_TAG = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
# [link target "]("] [path] DESIGN.md [#anchor | " section N.M"]
_REF = re.compile(r"(?P<link>\]\()?(?P<path>[\w./-]*?)DESIGN\.md"
                  r"(?:#(?P<anchor>[\w-]+)|\s+section\s+(?P<section>\d+(?:\.\d+)*))?")
# inside DESIGN.md: "section N" (not "CONTRACTS.md section N") and "](#anchor)"
_SELF_SECTION = re.compile(r"(?<!\.md )\bsection (\d+(?:\.\d+)*)")
_SELF_LINK = re.compile(r"\]\(#([\w-]+)\)")


@dataclass(frozen=True)
class Targets:
    sections: frozenset[str]
    anchors: frozenset[str]


def github_slug(heading: str) -> str:
    """The anchor GitHub renders for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(text: str) -> list[str]:
    return [m.group(2) for m in _HEADING.finditer(_FENCE.sub("", text))]


def design_targets(text: str) -> Targets:
    sections, anchors = set(), set(_ANCHOR_TAG.findall(text))
    for title in _headings(text):
        anchors.add(github_slug(title))
        if n := _NUMBERED.match(title):
            sections.add(n.group(1))
    return Targets(frozenset(sections), frozenset(anchors))


def duplicate_sections(text: str) -> list[str]:
    seen: list[str] = []
    for title in _headings(text):
        if n := _NUMBERED.match(title):
            seen.append(n.group(1))
    return sorted({s for s in seen if seen.count(s) > 1})


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_text(text: str, where: Path, targets: Targets, design: Path = DESIGN) -> list[str]:
    """Problems with the design references in ``text`` (a file at ``where``)."""
    errors = []
    for m in _REF.finditer(text):
        at = f"{where}:{_line(text, m.start())}"
        path = m.group("path")
        if m.group("link"):
            if (where.parent / f"{path}DESIGN.md").resolve() != design.resolve():
                errors.append(f"{at}: link {path}DESIGN.md does not resolve to {design}")
                continue
        elif not (path == "docs/" or path.endswith("/docs/")):
            errors.append(f"{at}: cite the file as docs/DESIGN.md, not {path}DESIGN.md")
            continue
        section, anchor = m.group("section"), m.group("anchor")
        if section and section not in targets.sections:
            errors.append(f"{at}: docs/DESIGN.md has no section {section}")
        if anchor and anchor not in targets.anchors:
            errors.append(f"{at}: docs/DESIGN.md has no anchor #{anchor}")
    return errors


def check_self(text: str, targets: Targets, where: Path = DESIGN) -> list[str]:
    errors = []
    for m in _SELF_SECTION.finditer(text):
        if m.group(1) not in targets.sections:
            errors.append(f"{where}:{_line(text, m.start())}: no section {m.group(1)}")
    for m in _SELF_LINK.finditer(text):
        if m.group(1) not in targets.anchors:
            errors.append(f"{where}:{_line(text, m.start())}: no anchor #{m.group(1)}")
    return errors


def repo_text_files(root: Path = ROOT) -> list[Path]:
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p in SKIP_DIRS for p in rel.parts[:-1]):
            continue
        if not path.is_file() or path.resolve() in (DESIGN.resolve(), Path(__file__).resolve()):
            continue
        is_text = path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES
        if is_text and path.stat().st_size <= MAX_BYTES:
            out.append(path)
    return out


@pytest.fixture(scope="module")
def targets() -> Targets:
    assert DESIGN.is_file(), f"{DESIGN} is missing: code and docs cite it"
    return design_targets(DESIGN.read_text(encoding="utf-8"))


def test_design_has_unique_numbered_sections(targets: Targets) -> None:
    assert {str(n) for n in range(1, 10)} <= targets.sections
    assert duplicate_sections(DESIGN.read_text(encoding="utf-8")) == []


def test_design_internal_references_resolve(targets: Targets) -> None:
    assert check_self(DESIGN.read_text(encoding="utf-8"), targets) == []


def test_every_design_reference_in_the_repo_resolves(targets: Targets) -> None:
    errors, found = [], 0
    for path in repo_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += len(_REF.findall(text))
        errors += check_text(text, path.relative_to(ROOT), targets, DESIGN.relative_to(ROOT))
    assert not errors, "\n".join(errors)
    assert found >= 15, f"only {found} design references found: is the scan broken?"


def test_checker_catches_bad_references(tmp_path: Path) -> None:
    design = tmp_path / "docs" / "DESIGN.md"
    design.parent.mkdir()
    design.write_text('# Design\n<a id="facts"></a>\n## 1. Users\n### 1.2 CI gate\n'
                      '```bash\n# 3. not a heading\n```\n')
    t = design_targets(design.read_text())
    assert t.sections == {"1", "1.2"}
    assert {"facts", "1-users", "12-ci-gate"} <= t.anchors
    name = "DESIGN" + ".md"  # built here so the repository scan never sees these examples
    good = (f"see docs/{name} section 1.2; docs/{name}#facts; [d](docs/{name}#1-users); "
            f"[whole](docs/{name})")
    assert check_text(good, tmp_path / "README.md", t, design) == []
    bad = {
        f"docs/{name} section 7": "has no section 7",
        f"docs/{name} section 1.3": "has no section 1.3",
        f"docs/{name}#no-such": "has no anchor #no-such",
        f"as {name} section 1 says": "cite the file as docs/",
        f"[x](../{name}#facts)": "does not resolve",
    }
    for text, expected in bad.items():
        errors = check_text(text, tmp_path / "README.md", t, design)
        assert len(errors) == 1 and expected in errors[0], (text, errors)
    # relative Markdown links resolve from the citing file's directory
    assert check_text(f"[d]({name}#facts)", tmp_path / "docs" / "x.md", t, design) == []
    assert check_self("see section 1.2 and [f](#facts)", t) == []
    assert len(check_self("see section 4 and [f](#gone); CONTRACTS.md section 4", t)) == 2
