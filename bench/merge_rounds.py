#!/usr/bin/env python3
"""One CSV from the per-call CSVs of alternating rounds (bench/hopper_rounds.sh, bench/decode_roofline.sh).

    python3 bench/merge_rounds.py FOLDER OUT.csv

Every FOLDER/<side>-<round>-<rest>.csv (fa-bench's columns, written by fa-bench or a peer script) goes into OUT.csv
under fa-bench's header once, each row with its round in the suite column: round<k>, and round<k>-pages<N> for a
row of a paged cache (suite decode-pages<N>), round<k>-window<L>_<R>, -softcap<C>, -sinks for a row timed with a
model feature or a pack, -varlen<count>_<total> (the suffixes fa-bench and sdpa_peers.py give its suite), as tools/tables.py reads them; a row of side
`old` (an earlier tree's fa-bench, FA_ROUND_BENCH) gets `old` appended to its variant.
"""
import csv
import glob
import os
import re
import sys

#: The suite's suffixes a round keeps: a paged cache's and the model features'.
KEPT = re.compile(r"-(pages|window|softcap|sinks|varlen)")


def merge(folder: str, out: str) -> int:
    """Writes OUT; returns the number of rows."""
    rows, header = [], None
    for path in sorted(glob.glob(os.path.join(folder, "*.csv"))):
        side, round_, _ = os.path.basename(path).split("-", 2)
        with open(path, newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            if head is None:
                continue
            header = header or head
            suite = header.index("suite")
            for row in reader:
                if side == "old":
                    row[1] = (row[1] + "-old") if row[1] else "old"
                kept = KEPT.search(row[suite])
                row[suite] = "round" + round_ + (row[suite][kept.start():] if kept else "")
                rows.append(row)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header or [])
        writer.writerows(rows)
    return len(rows)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 bench/merge_rounds.py FOLDER OUT.csv")
    print(f"{merge(sys.argv[1], sys.argv[2])} rows in {sys.argv[2]}")
