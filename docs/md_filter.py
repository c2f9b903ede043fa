#!/usr/bin/env python3
"""Doxygen input filter for the course's Markdown pages (Doxyfile: FILTER_PATTERNS = *.md=...).

The Markdown files are written for reading on disk or on a Git host: their links are relative paths
(`../04_tiled_online_softmax/README.md`, `naive.cu`, `../../docs/results/h100-2026-11-23-steps.csv`,
`../../docs/glossary.md#occupancy`). In the HTML site every page sits in one flat folder, so those
paths would break. This filter rewrites them for Doxygen only, leaving the files untouched:

  * a link to a Markdown page of the site -> `@ref md_<path>` (Doxygen's name for that page);
  * a link to a heading anchor of docs/glossary.md -> `@ref glossary-<anchor>`, and the glossary's
    level-2 headings (one per term) get those labels;
  * an image -> its file name, found through IMAGE_PATH (docs/figures);
  * a link to any other file or folder of the repository -> `repo/<path>`, a copy of the sources
    that the `docs` target puts next to the HTML (a folder with a README.md links to that page).

Usage (by Doxygen): md_filter.py FILE  -> the filtered text on stdout.
"""
from __future__ import annotations

import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
HEADING2 = re.compile(r"^## (.+?)\s*$")


def slug(text: str) -> str:
    """The anchor a Git host gives a heading: lower case, spaces to '-', punctuation dropped."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


PAGES = [r"steps/[^/]+/README\.md", r"exercises/README\.md", r"exercises/[^/]+/README\.md", r"docs/[^/]+\.md",
         r"docs/results/[^/]+\.md", r"docs/results/runs/[^/]+\.md", r"notebooks/README\.md"]


def is_page(path: str) -> bool:
    """Whether a Markdown file of the repository is a page of the site (docs/CMakeLists.txt's INPUT)."""
    rel = os.path.relpath(path, REPO)
    return any(re.fullmatch(p, rel) for p in PAGES) and not rel.endswith("mainpage.md")


def page_name(path: str) -> str:
    """Doxygen's page name for a Markdown file of the repository: md_ + its path with / and . as _."""
    rel = os.path.relpath(path, REPO)
    return "md_" + re.sub(r"[/.\-]", "_", rel[: -len(".md")])


def rewrite(source: str, text: str) -> str:
    here = os.path.dirname(os.path.abspath(source))
    glossary = os.path.join(REPO, "docs", "glossary.md")

    def fix(match: re.Match) -> str:
        bang, label, target = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#") or target.startswith("@ref"):
            return match.group(0)  # a URL, an anchor of this page, or already Doxygen's
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else os.path.abspath(source)
        if bang:  # images: by file name through IMAGE_PATH
            return f"![{label}]({os.path.basename(full)})"
        if full == glossary and anchor:
            return f"[{label}](@ref glossary-{anchor})"
        if full == os.path.join(REPO, "docs", "mainpage.md"):
            return f"[{label}](@ref mainpage)"
        if os.path.isdir(full) and is_page(os.path.join(full, "README.md")):
            return f"[{label}](@ref {page_name(os.path.join(full, 'README.md'))})"
        if full.endswith(".md") and is_page(full):
            return f"[{label}](@ref {page_name(full)})"
        rel = os.path.relpath(full, REPO)
        # Doxygen reads a link to a .md file as a page reference: name the copy through an anchor-free
        # HTML link instead.
        if rel.endswith(".md"):
            return f'<a href="repo/{rel}">{label}</a>'
        return f"[{label}](repo/{rel}{'/' if os.path.isdir(full) else ''})"

    # Links may wrap across lines ("[register\nspill](...)"), so they are rewritten a prose block at a
    # time; fenced code is left alone. Line count is kept, so Doxygen's line numbers stay right.
    out, prose, in_code = [], [], False

    def flush():
        if prose:
            out.extend(LINK.sub(fix, "\n".join(prose)).split("\n"))
            prose.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            flush()
            in_code = not in_code
            out.append(line)
        elif in_code:
            out.append(line)
        else:
            heading = HEADING2.match(line)
            if heading and os.path.abspath(source) == glossary:
                line = f"## {heading.group(1)} {{#glossary-{slug(heading.group(1))}}}"
            prose.append(line)
    flush()
    return "\n".join(out) + "\n"

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(rewrite(sys.argv[1], f.read()))
