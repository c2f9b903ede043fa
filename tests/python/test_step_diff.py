#!/usr/bin/env python3
"""tools/step-diff never diffs across parts unless it is told to: every step's base (the step `tools/step-diff NN`
diffs it against) lies in the step's own part; only the first step of a part may build on a forward step (the part it
grows from: Hopper's 20 on mma.sync's 18, the backward's 26 on step 01), or start a new kernel ("none", with a
sentence that says so). A part with steps of both passes (the models' features: 49 on the forward's 25, 52 on the
backward's 41) has a first step of each pass, and its first backward step may build on a backward step; likewise its
first decode step (59, on the decode part's 48). The parts are tools/check_prose.py's, read from the steps' sources.

Plain asserts, no pytest, Python 3 only. First the rule must reject a made-up course whose first decode step
diffs against the backward step numbered before it (what `tools/step-diff 41` did before the renumbering), then
the real tree must pass.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import check_prose  # noqa: E402  the one place that knows which part a step belongs to

FORWARD = ("cuda-cores", "mma-sync", "hopper")


def problems(part_of: dict, base_of: dict, backward_of: dict = None, decode_of: dict = None) -> list:
    """part_of: step id -> part, in course order; base_of: step id -> the base's id or 'none'; backward_of: step id ->
    whether it is a backward step (none given: every step the forward's); decode_of: step id -> whether it is a decode
    step (a features step that decodes, 59, is its part's first decode step and may build on a decode step)."""
    backward_of, decode_of = backward_of or {}, decode_of or {}
    found, seen = [], set()
    for sid, part in part_of.items():
        backward = backward_of.get(sid, False)
        decode = decode_of.get(sid, False) and part != "decode"
        kind = "backward" if backward else "decode" if decode else "forward"
        first = (part, kind) not in seen  # the part's first step of this pass
        seen.add((part, kind))
        base = base_of[sid]
        if base == "none":
            if not first:
                found.append(f"step {sid}: step-diff has no base for it, but it is not the first step of its part ({part})")
            continue
        if int(base) >= int(sid):
            found.append(f"step {sid}: its base {base} does not come before it")
        base_part = part_of.get(base)
        if base_part == part:
            continue
        if not first:
            found.append(f"step {sid} ({part}) diffs against step {base} ({base_part}): a step other than its part's "
                         "first must build on a step of its own part")
        elif base_part not in FORWARD and not (backward and base_part == "backward") and \
                not (decode and base_part == "decode"):
            found.append(f"step {sid}, the first of {part}, diffs against step {base} ({base_part}): the first step of a "
                         "part builds on a forward step or starts a new kernel (NEW in tools/step-diff)")
    return found


def step_diff(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(REPO, "tools", "step-diff"), *args], capture_output=True, text=True)


def main() -> int:
    # A made-up course: the decode part's first step left to the default base, the backward step before it.
    part_of = {"38": "backward", "39": "backward", "40": "backward", "41": "decode", "42": "decode"}
    wrong = problems(part_of, {"38": "none", "39": "38", "40": "39", "41": "40", "42": "41"})
    assert len(wrong) == 1 and "step 41, the first of decode, diffs against step 40 (backward)" in wrong[0], wrong
    # A later step of a part that diffs across parts, and a base that is not before the step.
    wrong = problems(part_of, {"38": "none", "39": "38", "40": "39", "41": "none", "42": "39"})
    assert wrong == ["step 42 (decode) diffs against step 39 (backward): a step other than its part's first must "
                     "build on a step of its own part"], wrong
    assert "does not come before it" in problems(part_of, {"38": "none", "39": "40", "40": "39", "41": "none",
                                                           "42": "41"})[0]
    # Its first step starting a new kernel is right; a base in the part itself is right.
    assert problems(part_of, {"38": "none", "39": "38", "40": "39", "41": "none", "42": "41"}) == []
    assert problems({"40": "backward", "41": "backward"}, {"40": "none", "41": "none"}) == [
        "step 41: step-diff has no base for it, but it is not the first step of its part (backward)"]

    # A part with both passes: its first backward step builds on the backward part; its second may not.
    part_of = {"41": "backward", "49": "features", "50": "features", "52": "features", "53": "features"}
    backward_of = {"41": True, "52": True, "53": True}
    assert problems(part_of, {"41": "none", "49": "none", "50": "49", "52": "41", "53": "52"}, backward_of) == []
    wrong = problems(part_of, {"41": "none", "49": "none", "50": "49", "52": "41", "53": "41"}, backward_of)
    assert wrong == ["step 53 (features) diffs against step 41 (backward): a step other than its part's first must "
                     "build on a step of its own part"], wrong
    # A forward step of that part may not build on the backward.
    assert problems(part_of, {"41": "none", "49": "41", "50": "49", "52": "41", "53": "52"}, backward_of)

    # A decode step of that part builds on the decode part; a forward step of it may not.
    part_of = {"48": "decode", "49": "features", "50": "features", "59": "features"}
    assert problems(part_of, {"48": "none", "49": "none", "50": "49", "59": "48"}, {}, {"48": True, "59": True}) == []
    assert problems(part_of, {"48": "none", "49": "none", "50": "48", "59": "48"}, {}, {"48": True, "59": True})

    # The real tree.
    steps = check_prose.steps_from_sources(REPO)
    part_of = {s.id: s.part for s in steps}
    backward_of = {s.id: s.backward for s in steps}
    decode_of = {s.id: s.decode for s in steps}
    base_of = {}
    for s in steps:
        got = step_diff(s.id, "--base")
        assert got.returncode == 0, (s.id, got.stderr)
        base_of[s.id] = got.stdout.strip()
        if base_of[s.id] == "none" and s.id != steps[0].id:
            said = step_diff(s.id)
            assert said.returncode == 0 and re.search("starts a new (kernel|schedule)", said.stdout), (s.id, said.stdout, said.stderr)
    found = problems(part_of, base_of, backward_of, decode_of)
    for p in found:
        print(p)
    print(f"{len(steps)} steps, {sum(b == 'none' for b in base_of.values())} starting a new kernel: "
          f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
