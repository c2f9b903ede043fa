#!/usr/bin/env python3
"""Checks that the course's documents point at what exists, so links and line references cannot rot.

    python3 tools/check_docs.py                  # every Markdown file of the repository
    python3 tools/check_docs.py --html DIR       # also every relative link of a generated HTML site
    python3 tools/check_docs.py --root DIR       # another tree (the tests use a small broken one)

Markdown: every relative link and image must name a file or folder that exists, and a link with a
#anchor into a Markdown file must name one of its headings. Line references, written as a backticked
`file:LINE` followed by `: ` and the backticked code it quotes (e.g. `naive.cu:42`: `float m = -INFINITY;`),
must quote what is on that line (whitespace aside). HTML: every relative href and src must exist.
Prints each problem as FILE:LINE: what is wrong, and exits 1 if there is any.
"""
from __future__ import annotations

import argparse
import html.parser
import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
LINE_REF = re.compile(r"`([\w./\-]+\.(?:cu|cuh|cpp|hpp|h|py|sh|txt|cmake)):(\d+)`: `([^`]+)`")
BARE_LINE_REF = re.compile(r"`[\w./\-]+\.(?:cu|cuh|cpp|hpp|h|py):\d+`(?!: `)")
SKIP_DIRS = {"build", ".git", ".gpu-deps", ".old", ".abl", ".whl", "node_modules", "my-exercises"}


def slug(text: str) -> str:
    """A Git host's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def markdown_files(root: str) -> list[str]:
    try:  # the tracked and untracked-but-not-ignored files, as a fresh clone has them
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.split()
        if out:
            return [os.path.join(root, f) for f in out if os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        found += [os.path.join(dirpath, f) for f in filenames if f.endswith(".md")]
    return found


def headings(path: str) -> set[str]:
    anchors, in_code = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                in_code = not in_code
            elif not in_code and line.startswith("#"):
                text = line.lstrip("#").strip()
                anchors.add(slug(re.sub(r"\{#[^}]*\}", "", text)))
                anchors.update(re.findall(r"\{#([^}]+)\}", text))
    return anchors


def check_markdown(path: str, problems: list[str]) -> None:
    here = os.path.dirname(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    prose, in_code = [], False  # the page with fenced code blanked out, line for line
    for line in lines:
        fence = line.lstrip().startswith("```")
        prose.append("" if in_code or fence else line)
        in_code = in_code != fence
    text = "\n".join(prose)
    for match in LINK.finditer(text):  # a link's label may wrap onto the next line
        target = match.group(1)
        where = f"{path}:{text.count(chr(10), 0, match.start(1)) + 1}"
        if re.match(r"^[a-z]+:", target) or target.startswith("@ref"):
            continue
        file_part, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, file_part)) if file_part else path
        if not os.path.exists(full):
            problems.append(f"{where}: link to {target}: {os.path.relpath(full)} does not exist")
        elif anchor and full.endswith(".md") and anchor not in headings(full):
            problems.append(f"{where}: link to {target}: no heading with anchor #{anchor} there")
    for number, line in enumerate(prose, 1):
        where = f"{path}:{number}"
        for file_part, line_number, quoted in LINE_REF.findall(line):
            full = os.path.normpath(os.path.join(here, file_part))
            if not os.path.exists(full):
                problems.append(f"{where}: line reference {file_part}:{line_number}: no such file")
                continue
            with open(full, encoding="utf-8", errors="replace") as g:
                source = g.read().splitlines()
            n = int(line_number)
            squash = lambda s: " ".join(s.split())  # noqa: E731
            if n < 1 or n > len(source) or squash(quoted) not in squash(source[n - 1]):
                actual = source[n - 1].strip() if 1 <= n <= len(source) else "(past the end)"
                problems.append(f"{where}: line reference {file_part}:{n} quotes `{quoted}` but the line is `{actual}`")
        for bare in BARE_LINE_REF.findall(line):
            problems.append(f"{where}: line reference {bare} without the quoted code after it (write `f:N`: `code`)")


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.targets.append(value)


def check_html(site: str, problems: list[str]) -> None:
    for dirpath, _, filenames in os.walk(site):
        if os.path.relpath(dirpath, site).split(os.sep)[0] == "repo":
            continue  # the copied sources: not pages
        for name in filenames:
            if not name.endswith(".html"):
                continue
            path = os.path.join(dirpath, name)
            parser = _Links()
            with open(path, encoding="utf-8", errors="replace") as f:
                parser.feed(f.read())
            for target in parser.targets:
                if re.match(r"^[a-z]+:", target) or target.startswith("#") or target.startswith("//"):
                    continue
                file_part = target.split("#")[0].split("?")[0]
                if file_part and not os.path.exists(os.path.join(dirpath, file_part)):
                    problems.append(f"{path}: link to {target} does not resolve")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--html", help="a generated HTML site to check as well")
    args = parser.parse_args(argv)
    problems: list[str] = []
    files = markdown_files(args.root)
    for path in files:
        check_markdown(path, problems)
    if args.html:
        check_html(args.html, problems)
    for p in problems:
        print(p)
    print(f"{len(files)} Markdown files{' and ' + args.html if args.html else ''}: "
          f"{len(problems)} broken link(s) or line reference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
