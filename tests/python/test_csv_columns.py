#!/usr/bin/env python3
"""The Python tools read and write exactly fa-bench's CSV columns.

bench/plots.py holds the column list once (bench/sdpa_peers.py imports it); this
checks it against the header bench/fa_bench.cpp writes. Plain asserts, no pytest.
"""
import os
import re
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "bench"))
import plots  # noqa: E402
import sdpa_peers  # noqa: E402

with open(os.path.join(REPO, "bench", "fa_bench.cpp")) as f:
    source = f.read()
# The header is written as adjacent string literals after `csv << "step,...`.
match = re.search(r'csv << ((?:"[^"]*"\s*)+)', source)
assert match, "fa_bench.cpp: no `csv << \"step,...\"` header found"
header = "".join(re.findall(r'"([^"]*)"', match.group(1))).strip().replace("\\n", "")
assert header.split(",") == plots.COLUMNS, f"fa-bench writes {header}, plots.py reads {','.join(plots.COLUMNS)}"
assert sdpa_peers.COLUMNS is plots.COLUMNS
print("CSV columns: bench/plots.py and bench/sdpa_peers.py match fa-bench's header")
