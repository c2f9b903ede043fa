#!/usr/bin/env python3
"""tools/check_docs.py finds each kind of rot it claims to, and the repository's own documents have none.

Plain asserts, no pytest. A small tree in a temporary folder holds one good page and one page
with every kind of fault (a missing file, one behind a label that wraps onto the next line, a missing anchor, a line reference that quotes the
wrong code, one past the end of the file, one with no quoted code, a broken href in HTML); the
checker must name each of them and exit 1, and must pass the good page alone. Then the real
repository must pass, so a renamed file or a shifted line fails `ctest`, not a reader.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "..", "..", "tools", "check_docs.py")


def run(*args):
    done = subprocess.run([sys.executable, CHECKER, *args], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


with tempfile.TemporaryDirectory() as root:
    write(root, "src/kernel.cu", "int a = 1;\nfloat m = -INFINITY;\n")
    write(root, "docs/glossary.md", "# Glossary\n\n### Warp {#glossary-warp}\n\n### Bank conflict\n")
    write(root, "good.md",
          "[warp](docs/glossary.md#glossary-warp) [banks](docs/glossary.md#bank-conflict)\n"
          "`src/kernel.cu:2`: `float m = -INFINITY;`\n"
          "```\n[not a link inside code](nowhere.md)\n```\n")

    code, out = run("--root", root)
    assert code == 0, f"a tree with no fault must pass, got exit {code}:\n{out}"

    write(root, "bad.md",
          "[gone](missing.md)\n"
          "[no such heading](docs/glossary.md#shuffle)\n"
          "`src/kernel.cu:1`: `float m = -INFINITY;`\n"
          "`src/kernel.cu:9`: `float m = -INFINITY;`\n"
          "see `src/kernel.cu:2` for the start\n"
          "a [wrapped\nlabel](gone-too.md)\n")
    write(root, "site/index.html", '<a href="page.html">x</a><img src="fig.png"><a href="#top">t</a>')
    write(root, "site/page.html", "<p>here</p>")

    code, out = run("--root", root, "--html", os.path.join(root, "site"))
    assert code == 1, f"a tree with faults must fail with exit 1, got {code}:\n{out}"
    expected = [
        "bad.md:1: link to missing.md",
        "bad.md:2: link to docs/glossary.md#shuffle: no heading with anchor #shuffle",
        "bad.md:3: line reference src/kernel.cu:1 quotes `float m = -INFINITY;` but the line is `int a = 1;`",
        "bad.md:4: line reference src/kernel.cu:9 quotes",
        "(past the end)",
        "bad.md:5: line reference `src/kernel.cu:2` without the quoted code",
        "bad.md:7: link to gone-too.md",
        "index.html: link to fig.png does not resolve",
    ]
    for needle in expected:
        assert needle in out, f"the checker did not report {needle!r}; it printed:\n{out}"
    assert "page.html does not resolve" not in out and "#top" not in out, out
    assert "good.md" not in out, f"the good page was reported:\n{out}"
    assert "7 broken link(s)" in out, out

code, out = run()
assert code == 0, f"the repository's Markdown has broken links or line references:\n{out}"
print("check_docs: every fault found in the fixture; the repository's documents pass")
