#!/usr/bin/env python3
"""Checks that what the course's prose says about its steps is what the registry says, so lists of steps
cannot go stale as steps are added.

    python3 tools/check_prose.py                          # facts read from the step sources
    python3 tools/check_prose.py --fa-run build/bench/fa-run   # facts from `fa-run --list` (the registry as
                                                          # built); the source reading must agree with it
    python3 tools/check_prose.py --write                  # rewrite the generated blocks from the facts
    python3 tools/check_prose.py --root DIR               # another tree (the tests use a copy)

The facts: every step's id, folder, oldest GPU (`min_arch`, and `arch_specific` for sm_90a: runs on sm_90
alone), pass, dtypes and whether it takes a KV cache, and the Python steps of steps/python_steps.tsv (schedules over
the kernels across GPUs, in no C++ registry: their part is context parallelism); from them each step's part of the course (CUDA cores,
mma.sync, Hopper, backward, inference: decode), each one run of consecutive numbers in reading order (a step added
to a part after the next part began is numbered into its part and the steps after it renumbered, as step 41 was on
2026-11-28: tools/plots.py's OLD_TO_NEW). Also every
exercise's minutes (exercises/*/exercise.spec), every mutant's step, checker and mistake (tests/mutants/*.mutant)
and the GPUs of the recorded runs (docs/results/). The prose: README.md, docs/*.md, notebooks/README.md and
exercises/README.md.

What it checks:
1. Generated blocks, `<!-- generated: NAME ... -->` to `<!-- end generated -->`, hold exactly what
   `--write` would put there (step tables by part, GPU classes, mistakes by part).
2. Step tables (a Markdown table whose first column is `step` and which has a `GPU` column): every row's
   GPU matches its step, each row's step follows the one before in number, and the table starts and ends
   where a part does.
3. Claims in a clause: "steps 09-18 need sm_80 or newer", "exercises 20-25 ... sm_90 exactly", "step 29:
   ..., sm_90", "26 and 27 run on any GPU", "steps 28-37 ... (f16 and bf16)". A step or exercise range (NN,
   NN-MM, NN to MM, NN and MM) and, before the next range or the clause's end (`;` or `.`), a GPU (any
   GPU, sm_NN [or newer], sm_NN exactly / only, sm_NNa, H100 or H200) or two or more dtypes: every step
   named must have exactly that GPU, or exactly those dtypes (its first variant's).
4. Numbers: no step or exercise past the last; "… `stepNN/…`" and "… step NN" name the last step;
   "N plausible wrong kernels" is the number of mutants the harness must reject; "N steps, each one" /
   "N steps in all" the number of steps; "add up to N minutes" the exercises' minutes; "N probes" the
   zero-tile probes; "the N the harness cannot promise to see" the kernels' mutants left to other checks (a
   Python step's mutants, caught-by: cpu-test, are its CPU test's: tests/python/python_step_check.py).
5. Tables of mutants (first column `mutant`, with a `from step` column) have a row for every mutant file
   that is a mistake, with its file's step, and none for a mutant without a file.
6. Agendas (tables headed `| time | min | slot | what | exercise |`): each slot starts when the one before
   ends, an exercise slot takes its spec's minutes, and the "Minutes: ..." line after the tables adds up.
7. Every part is contiguous: its steps are one run of consecutive numbers, and the parts come in reading order.
8. Counts of all the steps ("48 steps", "55 registered steps") are the registry's (steps, or entries with the
   variants), unless the clause dates them ("then", "that day", "came later", a date); so is a count of cases
   for "every step"; an index example (`fa_course.steps()[10]` ... "step 11"), in prose or code, names the
   registry's entry at that index; a range of ctest names ("`step26/…` to `step41/…`") spans a part; "every step
   is a single .cu file" holds only while no step has two.
9. Every table of measured numbers (ms, TFLOPS, TB/s, GB/s), here and in the steps' READMEs, names its run: a
   recorded CSV or runs file of docs/results/ within 10 lines of it, so that two numbers for one step and shape from two runs
   are each attributed. (GPU names in a clause are check 3's; tools/doctor's are tests/python/test_doctor.py's.)

Prints each problem as FILE:LINE: what is wrong, and exits 1 if there is any.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # noqa: E402  the CSV ids of runs recorded before the renumbering (plots.step_id_of)

PROSE = ["README.md", "docs/*.md", "notebooks/README.md", "exercises/README.md"]
PARTS = [  # (key, name), in reading order
    ("cuda-cores", "CUDA cores"),
    ("mma-sync", "Tensor cores (mma.sync)"),
    ("hopper", "Hopper (wgmma, TMA)"),
    ("backward", "The backward pass"),
    ("decode", "Inference: decode"),
    ("features", "Model features"),
    ("context-parallel", "Past one GPU: context parallelism"),
]
DTYPE = {"float": "f32", "__half": "f16", "__nv_bfloat16": "bf16"}
# GPU classes a class might have, oldest first: (name, compute capability). CUDA 13's nvcc builds for
# sm_75 and newer (`nvcc --list-gpu-arch`), so a T4 is the oldest GPU the course can run on.
GPU_CLASSES = [("T4", 75), ("A100", 80), ("L4, RTX 40xx", 89), ("H100, H200", 90), ("B200", 100)]
# Recorded runs' file-name prefixes in docs/results/ and the GPU each names.
RECORDED_GPUS = [("H100", "h100-"), ("H200", "h200-"), ("A100", "a100-"), ("L4", "l4-"), ("T4", "t4-")]
NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
NUMBER_WORDS.update({w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())})


@dataclasses.dataclass
class Step:
    id: str
    dir: str = ""
    min_arch: int = 0
    arch_specific: bool = False
    backward: bool = False
    decode: bool = False
    features: bool = False
    dtypes: tuple = ()
    gpus: int = 0  # a Python step (steps/python_steps.tsv): the GPUs of one host it needs; 0 for a kernel step

    @property
    def gpu(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPUs"
        return f"sm_{self.min_arch}{'a' if self.arch_specific else ''}" if self.min_arch else "any"

    @property
    def part(self) -> str:
        if self.gpus:  # a schedule over the kernels across GPUs (steps 62-64)
            return "context-parallel"
        if self.features:  # before decode: step 59 takes the features in decode, a model-features step
            return "features"
        if self.decode:
            return "decode"
        if self.backward:
            return "backward"
        if self.arch_specific:
            return "hopper"
        return "mma-sync" if self.min_arch else "cuda-cores"

    def runs_on(self, cc: int) -> bool:
        if self.gpus:  # not one GPU's: the GPU classes table leaves it out
            return False
        if self.arch_specific:
            return cc == self.min_arch
        return cc >= max(self.min_arch, 75)


@dataclasses.dataclass
class Facts:
    steps: list  # of Step, in order
    minutes: dict  # exercise id -> minutes
    mutants: list  # of dicts: name, step, caught_by, mistake
    recorded: dict  # GPU name -> list of (relative path, set of step ids)
    labels: list = dataclasses.field(default_factory=list)  # every registry entry's label, in order ("05-pad1")

    def step(self, sid: str):
        return next((s for s in self.steps if s.id == sid), None)

    @property
    def last(self) -> str:
        return self.steps[-1].id

    def parts(self) -> list:
        """(key, name, [steps]) in reading order."""
        return [(key, name, [s for s in self.steps if s.part == key]) for key, name in PARTS]


# ---------------------------------------------------------------- facts

def number(text: str) -> int | None:
    text = text.lower().replace(",", "")
    if text.isdigit():
        return int(text)
    tens, _, ones = text.partition("-")
    if tens in NUMBER_WORDS and (not ones or ones in NUMBER_WORDS):
        return NUMBER_WORDS[tens] + (NUMBER_WORDS[ones] if ones else 0)
    return None


def python_steps(root: str) -> list:
    """The Python steps, from steps/python_steps.tsv (id, folder, lesson file, GPUs, summary): schedules over the
    kernels, in no C++ registry, so neither fa-run --list nor a .cu's Support has them."""
    path = os.path.join(root, "steps", "python_steps.tsv")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line[:1].isdigit()]
    return [Step(id=row[0], dir=row[1], gpus=int(row[3])) for row in rows]


def steps_from_sources(root: str) -> list:
    """Each step's facts from its own compile-time Support: the struct of the file that exports
    `launcher()` (the step's first variant in the registry), or the step's only one."""
    steps = []
    for folder in sorted(glob.glob(os.path.join(root, "steps", "[0-9][0-9]_*"))):
        if not os.path.isdir(folder):
            continue
        supports = []
        for path in sorted(glob.glob(os.path.join(folder, "*.cu"))):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            m = re.search(r"struct Support\b(.*?)\n\};|using Support\b(.*?);\n", text, re.S)  # the whole struct
            if m:
                supports.append((bool(re.search(r"\bLauncher launcher\(\)", text)), m.group(1) or m.group(2)))
        if not supports:
            continue
        body = next((b for plain, b in supports if plain), supports[0][1])
        dtypes = re.search(r"DTypes<([^>]*)>", body)
        name = os.path.basename(folder)
        arch = re.search(r"min_arch\s*=\s*(\d+)", body)
        steps.append(Step(
            id=name[:2], dir=name, min_arch=int(arch.group(1)) if arch else 0,
            arch_specific=bool(re.search(r"arch_specific\s*=\s*true", body)),
            backward="Pass::backward" in body, decode="cache_forms" in body, features="Features features{" in body,
            dtypes=tuple(DTYPE[t.strip()] for t in dtypes.group(1).split(",")) if dtypes else ()))
    return steps + python_steps(root)


def steps_from_fa_run(fa_run: str, root: str) -> list:
    """Each step's facts as `fa-run --list` prints the registry: fixed-width columns step, dtypes,
    head_dims, GPU, pass, then the summary (a KV-cache step's ends in "[KV cache: ...]")."""
    out = subprocess.run([fa_run, "--list"], capture_output=True, text=True, check=True).stdout
    dirs = {os.path.basename(d)[:2]: os.path.basename(d) for d in glob.glob(os.path.join(root, "steps", "[0-9][0-9]_*"))
            if os.path.isfile(os.path.join(d, "CMakeLists.txt"))}  # a step's folder, not one a renumbering emptied
    steps = []
    for line in out.splitlines():
        label = line[:14].strip()
        if not re.match(r"^\d\d(-|$)", label):
            continue
        sid = label[:2]
        if steps and steps[-1].id == sid:
            continue  # a later variant: the step's facts are its first variant's
        gpu, pass_ = line[41:49].strip(), line[49:59].strip()
        m = re.match(r"^sm_(\d+)(a?)$", gpu)
        steps.append(Step(id=sid, dir=dirs.get(sid, ""), min_arch=int(m.group(1)) if m else 0,
                          arch_specific=bool(m and m.group(2)), backward=pass_ == "backward",
                          decode="[KV cache:" in line[59:], features="[features:" in line[59:],
                          dtypes=tuple(d.strip() for d in line[14:29].split(","))))
    return steps + python_steps(root)


def labels_from_registry(root: str) -> list:
    """Every registry entry's label in the registry's order ("01", ..., "05-pad1", ...), read from registry.cpp."""
    with open(os.path.join(root, "common", "fa", "registry.cpp"), encoding="utf-8") as f:
        text = f.read()
    body = text[text.index("all_steps()"):]
    return [sid + (f"-{variant}" if variant else "") for sid, variant in re.findall(r'\{"(\d\d)", "([^"]*)",', body)]


def labels_from_fa_run(fa_run: str) -> list:
    """Every registry entry's label as `fa-run --list` prints them, in order."""
    out = subprocess.run([fa_run, "--list"], capture_output=True, text=True, check=True).stdout
    return [line[:14].strip() for line in out.splitlines() if re.match(r"^\d\d(-\S+)?\s", line[:15])]


def read_facts(root: str, fa_run: str | None, problems: list) -> Facts:
    steps = steps_from_sources(root)
    labels = labels_from_registry(root)
    if fa_run:
        listed_labels = labels_from_fa_run(fa_run)
        if listed_labels != labels:
            problems.append(f"tools/check_prose.py: registry.cpp lists {len(labels)} entries, fa-run --list "
                            f"{len(listed_labels)}: {sorted(set(labels) ^ set(listed_labels))}")
        labels = listed_labels
    if fa_run:
        listed = steps_from_fa_run(fa_run, root)
        if [dataclasses.astuple(s) for s in listed] != [dataclasses.astuple(s) for s in steps]:
            for a, b in zip(listed, steps):
                if a != b:
                    problems.append(f"tools/check_prose.py: reading the step sources gives {b}, fa-run --list {a}")
            if len(listed) != len(steps):
                problems.append(f"tools/check_prose.py: fa-run --list has {len(listed)} steps, the sources {len(steps)}")
        steps = listed
    minutes = {}
    for spec in glob.glob(os.path.join(root, "exercises", "[0-9][0-9]_*", "exercise.spec")):
        with open(spec, encoding="utf-8") as f:
            m = re.search(r"^minutes:\s*(\d+)", f.read(), re.M)
        minutes[os.path.basename(os.path.dirname(spec))[:2]] = int(m.group(1)) if m else 0
    mutants = []
    for path in sorted(glob.glob(os.path.join(root, "tests", "mutants", "*.mutant"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        field = lambda key: (re.search(rf"^{key}:\s*(.*)$", text, re.M) or [None, ""])[1].strip()  # noqa: E731
        mutants.append({"name": os.path.basename(path)[:-len(".mutant")], "step": field("step")[:2],
                        "caught_by": field("caught-by"), "mistake": field("mistake")})
    recorded = {}
    for gpu, prefix in RECORDED_GPUS:
        for path in sorted(glob.glob(os.path.join(root, "docs", "results", prefix + "*.csv"))):
            ids = set()
            with open(path, encoding="utf-8", newline="") as f:
                for row in csv.DictReader(f):
                    if re.match(r"^\d\d$", row.get("step") or ""):
                        ids.add(plots.step_id_of(path, row["step"]))
            recorded.setdefault(gpu, []).append((os.path.relpath(path, root), ids))
    return Facts(steps, minutes, mutants, recorded, labels)


# ---------------------------------------------------------------- generated blocks

def runs_of(ids: list) -> list:
    """[['09', ..., '18'], ['20']] for ['09', ..., '18', '20']: runs of consecutive numbers."""
    runs = []
    for sid in ids:
        if runs and int(sid) == int(runs[-1][-1]) + 1:
            runs[-1].append(sid)
        else:
            runs.append([sid])
    return runs


def span(ids: list) -> str:
    """'09-18, 20' for ['09', ..., '18', '20']."""
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs_of(ids)) or "none"


def gpu_words(step: Step) -> str:
    if step.gpus:
        return f"{step.gpus} GPUs of one host (PyTorch, NCCL)"
    if not step.min_arch:
        return "any GPU"
    if step.arch_specific:
        return f"sm_{step.min_arch} exactly (H100, H200: built for sm_{step.min_arch}a)"
    return f"sm_{step.min_arch} or newer"


def by_gpu(steps: list) -> str:
    """'09-18: sm_80 or newer; 19: sm_90 or newer': runs of consecutive steps with one GPU."""
    groups = []
    for s in steps:
        if groups and groups[-1][1] == gpu_words(s):
            groups[-1][0].append(s.id)
        else:
            groups.append(([s.id], gpu_words(s)))
    if len(groups) == 1:
        return groups[0][1]
    return "; ".join(f"{span(ids)}: {words}" for ids, words in groups)


def link(doc: str, root: str, target: str) -> str:
    return os.path.relpath(os.path.join(root, target), os.path.dirname(os.path.join(root, doc))).replace(os.sep, "/")


def gen_parts(facts: Facts, doc: str, root: str) -> str:
    rows = ["| part | steps | GPU | exercises |", "|---|---|---|---:|"]
    for _, name, steps in facts.parts():
        by_id = {s.id: s for s in steps}
        cite = lambda s: f"[{s.id}]({link(doc, root, 'steps/' + s.dir + '/README.md')})"  # noqa: E731
        ids = ", ".join(cite(by_id[r[0]]) + (f"-{cite(by_id[r[-1]])}" if len(r) > 1 else "")
                        for r in runs_of([s.id for s in steps]))
        minutes = sum(facts.minutes.get(s.id, 0) for s in steps)
        rows.append(f"| {name} | {ids} | {by_gpu(steps)} | {len(steps)}, {minutes // 60} h {minutes % 60:02d} min |")
    return "\n".join(rows) + "\n"


def gen_gpu_classes(facts: Facts, doc: str, root: str) -> str:
    rows = ["| GPU | compute capability | forward steps it runs | backward | decode | recorded runs |",
            "|---|---|---|---|---|---|"]
    for name, cc in GPU_CLASSES:
        runs = [s for s in facts.steps if s.runs_on(cc)]
        forward = [s.id for s in runs if s.part in ("cuda-cores", "mma-sync", "hopper")]
        backward = [s.id for s in runs if s.part == "backward"]
        decode = [s.id for s in runs if s.part == "decode"]
        records = []
        for gpu, files in facts.recorded.items():
            if gpu in name.replace(",", " ").split():
                covered = sorted(set().union(*(ids for _, ids in files)))
                shown = ", ".join(f"[`{os.path.basename(p)}`]({link(doc, root, p)})" for p, _ in files) \
                    if len(files) <= 4 else f"{len(files)} CSVs in [`docs/results/`]({link(doc, root, 'docs/results/README.md')})"
                records.append(f"{gpu}: steps {span(covered)} ({shown})")
        rows.append(f"| {name} | sm_{cc} | {span(forward)} | {span(backward)} | {span(decode)} | "
                    f"{'; '.join(records) or 'not measured'} |")
    return "\n".join(rows) + "\n"


def gen_mistakes(facts: Facts, doc: str, root: str) -> str:
    out = []
    part_of = {s.id: s.part for s in facts.steps}
    for key, name, steps in facts.parts():
        mine = [m for m in facts.mutants if part_of.get(m["step"]) == key and m["caught_by"] != "zero-tiles"]
        harness = sum(m["caught_by"] == "harness" for m in mine)
        cpu_test = sum(m["caught_by"] == "cpu-test" for m in mine)  # a Python step's: its CPU test rejects them
        others = len(mine) - harness - cpu_test
        said = [f"{harness} rejected by the harness"] if harness or not cpu_test else []
        said += [f"{cpu_test} rejected by the step's CPU test (tests/python/python_step_check.py)"] if cpu_test else []
        said += [f"{others} left to the checks named (compute-sanitizer's racecheck or memcheck, the SASS check)"] \
            if others else []
        out.append(f"**{name}, steps {span([s.id for s in steps])}**: {len(mine)} mutants, {', '.join(said)}.\n")
        if mine:
            out.append("| mutant | step | the mistake (its file's `mistake:` line) | caught by |")
            out.append("|---|---|---|---|")
            for m in sorted(mine, key=lambda m: (m["step"], m["name"])):
                mistake = m["mistake"].replace("|", "\\|")
                out.append(f"| [`{m['name']}`]({link(doc, root, 'tests/mutants/' + m['name'] + '.mutant')}) | "
                           f"{m['step']} | {mistake} | {m['caught_by']} |")
        out.append("")
    probes = [m for m in facts.mutants if m["caught_by"] == "zero-tiles"]
    if probes:
        out.append(f"Not mistakes: {len(probes)} probes ({', '.join('`' + m['name'] + '`' for m in probes)}) run steps "
                   f"{span(sorted({m['step'] for m in probes}))} with no K/V tile (caught-by: zero-tiles).")
    return "\n".join(out).rstrip("\n") + "\n"


GENERATORS = {"parts": gen_parts, "gpu-classes": gen_gpu_classes, "mistakes-by-part": gen_mistakes}
BLOCK = re.compile(r"(<!-- generated: ([\w-]+)[^>]*-->\n)(.*?)(<!-- end generated -->)", re.S)


# ---------------------------------------------------------------- checks of the prose

RANGE = r"(?<![\d.\-/=×])(\d{2})(?:\s*(-|–|to|and)\s*(\d{2}))?(?![\d.]|-\w)"
SUBJECT = re.compile(r"\b([Ss]teps?|[Ee]xercises?)\s+" + RANGE)
FOLLOWER = re.compile(r"(?:,|;|\(|\band|\bor)\s*(?:(?:then|of the \w+ steps?,?|the \w+ steps?,?)\s+)?" + RANGE)
ARCH = re.compile(r"sm_(\d{2,3})(a)?\b(\s+(?:exactly|only))?|\bH100 or H200\b|\bany GPU\b|\bruns? on any\b")
DTYPES = re.compile(r"\b(?:f32|f16|bf16)\b(?:\s*(?:/|,|\band\b|\bor\b)\s*\b(?:f32|f16|bf16)\b)+")
COUNTS = [  # (pattern with one number, what it must equal, what that is)
    (r"\b(\w+(?:-\w+)?) plausible wrong kernels", "harness", "mutants the harness must reject (caught-by: harness)"),
    (r"\b(\w+(?:-\w+)?) steps(?=,? each one|\s+in all)", "steps", "steps in the registry"),
    (r"\bcourse(?:'s| has) (\w+(?:-\w+)?) steps\b", "steps", "steps in the registry"),
    (r"\badd up to (\d[\d,]*) minutes", "minutes", "minutes of the exercises' specs"),
    (r"\b(\w+(?:-\w+)?) probes\b", "probes", "zero-tile probes (caught-by: zero-tiles)"),
    (r"\bthe (\w+(?:-\w+)?) the harness cannot promise to see", "others", "kernels' mutants caught by memcheck, racecheck or sass"),
]


#: "48 steps", "55 registered steps", "54 steps and variants", "every step (54 entries)": counts of all the steps.
ALL_STEPS = re.compile(r"\b(\d[\d,]*|[a-z]+(?:-[a-z]+)?) (?:registered |course )?(?:steps|entries|labels)"
                       r"(?: and variants)?\b")
#: Words that date a count ("then", "that day", "came later"): a count true on a past day, said so.
DATED = re.compile(r"\bthen\b|\bthat day\b|\bcame later\b|\bat the time\b|\b20\d\d-\d\d-\d\d\b|\bbefore the renumbering\b")
#: "every forward and backward step (13,440 cases)": a claim about every step with a count that depends on them.
EVERY_STEP = re.compile(r"\bevery (?:[\w-]+ ){0,4}?steps?\b")
CASES = re.compile(r"\b\d[\d,]* cases\b")
#: Steps of something else: training steps of a model ("trained for 600 steps", "the last 100 steps' loss").
TRAINING = re.compile(r"\btrain|\bloss\b|\blearn|\boptimi[sz]", re.I)
#: `fa_course.steps()[N]` and the label the text gives it (in backticks or quotes, or "step NN").
INDEXED = re.compile(r"steps\(\)\[(\d+)\][^\n]{0,100}?(?:\bstep (\d\d(?:-\w+)?)\b|[`'\"](\d\d(?:-\w+)?)[`'\"])")
#: A table of measured numbers: a header cell in one of these units.
MEASURED = re.compile(r"(?:^|[\s(|])(?:ms|TFLOPS|TB/s|GB/s)(?:$|[\s)|])")
#: Where a table's numbers come from: a recorded file of docs/results/ (a CSV, a runs file), or a generated block.
SOURCE = re.compile(r"(?:docs/)?results/[\w./-]*\.(?:csv|txt)|course-table")

SHOWN = None  # --show: the claims checked
ROOT_FOR_FILES = ["."]  # the tree checked (main sets it): check_claims looks at a step's files


def arch_of(text: str):
    m = ARCH.search(text)
    if not m:
        return None
    if m.group(0).startswith("sm_"):
        return int(m.group(1)), bool(m.group(2) or m.group(3))
    return (90, True) if m.group(0).startswith("H100") else (0, False)


def plain(text: str) -> str:
    """Markdown to what a reader reads: links to their labels, no backticks or emphasis."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[`*]", "", text)


def step_ids(a: str, how: str | None, b: str | None) -> list:
    if not b:
        return [a]
    if how == "and":
        return [a, b]
    return [f"{i:02d}" for i in range(int(a), int(b) + 1)]


def check_claims(text: str, where, facts: Facts, problems: list) -> None:
    """Step and exercise ranges with a GPU or dtypes in the same clause; steps past the last; counts."""
    last = int(facts.last)
    for sentence_match in re.finditer(r"(?:[^.;]|\.(?!\s|$))+", text):  # a clause ends at "; " or ". "
        sentence, base = sentence_match.group(0), sentence_match.start()
        mentions = []  # (start, end, ids)
        for m in SUBJECT.finditer(sentence):
            mentions.append((m.start(), m.end(), step_ids(m.group(2), m.group(3), m.group(4)), m.group(1)))
            pos = m.end()
            while True:  # "steps 28-37 need sm_90, 38-40 sm_90 exactly": a list under one "steps"
                nxt = FOLLOWER.search(sentence, pos)
                if not nxt or (SUBJECT.search(sentence, pos) and SUBJECT.search(sentence, pos).start() < nxt.start()):
                    break
                between = re.sub(r"sm_\d+a?", "", sentence[pos:nxt.start()])
                if len(between) > 120 or re.search(r"\b\d+\b", between):  # "step 07 ... at head_dim 32 and 64"
                    break
                ids = step_ids(nxt.group(1), nxt.group(2), nxt.group(3))
                before, seen = mentions[-1][2], {sid for mention in mentions for sid in mention[2]}
                inside = nxt.group(0).startswith("(") and int(before[0]) <= int(ids[0]) and int(ids[-1]) <= int(before[-1])
                if not inside and (seen & set(ids) or int(ids[-1]) > last):
                    break  # a list names new steps, or details the range before in brackets: "11 and 12 (50 min)" is not one
                mentions.append((nxt.start(), nxt.end(), ids, m.group(1)))
                pos = nxt.end()
        mentions.sort()
        pending = []
        for i, (start, end, ids, kind) in enumerate(mentions):
            for sid in ids:
                if int(sid) > last or int(sid) < 1:
                    problems.append(f"{where(base + start)}: {kind.lower()} {sid} does not exist: the last step is {facts.last}")
            scope = sentence[end:mentions[i + 1][0] if i + 1 < len(mentions) else len(sentence)]
            if re.fullmatch(r"[\s,]*(?:and|or)?[\s,]*", scope):  # "09-18 and 20-25 take ...": shares the next one's
                pending += ids
                continue
            ids, pending = pending + ids, []
            steps = [facts.step(sid) for sid in ids if facts.step(sid)]
            claim = arch_of(scope)
            if SHOWN is not None and (claim is not None or DTYPES.search(scope)):
                SHOWN.append(f"{where(base + start)}: {kind.lower()} {span(ids)}:{scope[:70]}")
            if claim is not None:
                wrong = [s for s in steps if (s.min_arch, s.arch_specific) != claim]
                if wrong:
                    said = ARCH.search(scope).group(0)
                    problems.append(f"{where(base + start)}: \"{kind.lower()} {span(ids)} ... {said}\", but the registry has "
                                    + ", ".join(f"{s.id}: {s.gpu}" for s in wrong))
            dtypes = DTYPES.search(scope)
            if dtypes and not re.match(r"\s*(?:inputs? )?(?:in|to)\b", scope[dtypes.end():]):
                said = set(re.findall(r"f32|f16|bf16", dtypes.group(0)))
                wrong = [s for s in steps if set(s.dtypes) != said]
                if wrong:
                    problems.append(f"{where(base + start)}: \"{kind.lower()} {span(ids)} ... {dtypes.group(0)}\", but the "
                                    "registry has " + ", ".join(f"{s.id}: {', '.join(s.dtypes)}" for s in wrong))
    # "`step26/…` to `step41/…`": a range of ctest names spans a part, first step to last.
    for m in re.finditer(r"`?step(\d\d)/…`?\s+to\s+`?step(\d\d)/…", text):
        spans = {(steps[0].id, steps[-1].id): name for _, name, steps in facts.parts() if steps}
        if (m.group(1), m.group(2)) not in spans:
            problems.append(f"{where(m.start())}: \"step{m.group(1)}/… to step{m.group(2)}/…\" is not a part's steps; the parts run "
                            + "; ".join(f"{a}-{b}" for a, b in spans))
    # "every step is a single .cu file": true only while no step folder holds a second kernel file.
    for m in re.finditer(r"\b(?:every|each) step(?:'s lesson)? is (?:a single|one) `?\.cu`? file", text, re.I):
        several = [s.dir for s in facts.steps if len(glob.glob(os.path.join(ROOT_FOR_FILES[0], "steps", s.dir, "*.cu"))) > 1]
        if several:
            problems.append(f"{where(m.start())}: \"{m.group(0)}\": steps {', '.join(d[:2] for d in several)} have "
                            "more than one .cu file")
    last_kernel = [s.id for s in facts.steps if not s.gpus][-1]  # ctest's `stepNN/…` entries are the kernel steps'
    for m in re.finditer(r"(?:…|\.\.\.)\s*`?(?:step|steps? )(\d{2})(/)?", text):
        if m.group(1) != (last_kernel if m.group(2) else facts.last):
            problems.append(f"{where(m.start())}: \"… step{m.group(1)}\" names step {m.group(1)} as the last; the last is {facts.last}")
    # "48 steps", "every step (55 labels)": a count larger than any part's is a count of all the steps (or of every
    # registry entry, variants included), unless its clause dates it ("then", "that day", "came later", a date).
    biggest_part = max(len(steps) for _, _, steps in facts.parts())
    for clause in re.finditer(r"(?:[^.;]|\.(?!\s|$))+", text):
        if DATED.search(clause.group(0)) or TRAINING.search(clause.group(0)):
            continue
        for m in ALL_STEPS.finditer(clause.group(0)):
            n = number(m.group(1))
            if n is not None and n > biggest_part and n not in (len(facts.steps), len(facts.labels)):
                problems.append(f"{where(clause.start() + m.start())}: \"{m.group(0)}\": the registry has "
                                f"{len(facts.steps)} steps, {len(facts.labels)} entries with the variants (or say when "
                                "the count was true: \"then\", a date)")
        if EVERY_STEP.search(clause.group(0)) and CASES.search(clause.group(0)) and not DATED.search(clause.group(0)):
            problems.append(f"{where(clause.start())}: \"{EVERY_STEP.search(clause.group(0)).group(0)} ... "
                            f"{CASES.search(clause.group(0)).group(0)}\": a count of cases for every step goes stale as "
                            "steps are added: say which steps, or when (\"then\", a date)")
    harness = sum(m["caught_by"] == "harness" for m in facts.mutants)
    probes = sum(m["caught_by"] == "zero-tiles" for m in facts.mutants)
    cpu_test = sum(m["caught_by"] == "cpu-test" for m in facts.mutants)  # the Python steps': no kernel, no harness
    truth = {"harness": harness, "steps": len(facts.steps), "minutes": sum(facts.minutes.values()),
             "probes": probes, "others": len(facts.mutants) - harness - probes - cpu_test}
    for pattern, key, what in COUNTS:
        for m in re.finditer(pattern, text):
            n = number(m.group(1))
            if n is not None and n != truth[key]:
                problems.append(f"{where(m.start())}: \"{m.group(0)}\": there are {truth[key]} {what}")


def check_parts_contiguous(facts: Facts, problems: list) -> None:
    """Each part one run of consecutive step numbers, the parts in reading order (PARTS)."""
    order = [key for key, _ in PARTS]
    for key, name, steps in facts.parts():
        runs = runs_of([s.id for s in steps])
        if len(runs) > 1:
            problems.append(f"steps/: the part {name!r} is not contiguous ({span([s.id for s in steps])}): number a "
                            "step added to a part into it and renumber the steps after it (tools/plots.py's OLD_TO_NEW "
                            "maps the recorded CSVs' ids)")
    for a, b in zip(facts.steps, facts.steps[1:]):
        if order.index(b.part) < order.index(a.part):
            problems.append(f"steps/: step {b.id} ({b.part}) comes after step {a.id} ({a.part}): the parts go "
                            + ", ".join(order))


def check_step_table(rows: list, facts: Facts, problems: list, path: str) -> None:
    """rows: (line number, cells) of a table whose header has `step` first and a `GPU` column."""
    (_, header), body = rows[0], rows[2:]
    gpu_col = header.index("GPU")
    ids = []
    for number_, cells in body:
        m = re.match(r"^\[?(\d{2})\b", plain(cells[0]))
        if not m:
            continue
        sid, step = m.group(1), facts.step(m.group(1))
        if step is None:
            problems.append(f"{path}:{number_}: step {sid} does not exist: the last step is {facts.last}")
            continue
        ids.append(sid)
        cell = plain(cells[gpu_col]) if gpu_col < len(cells) else ""
        claim = (0, False) if cell.strip().startswith("any") else arch_of(cell)
        if claim is not None and claim != (step.min_arch, step.arch_specific):
            problems.append(f"{path}:{number_}: step {sid}'s GPU is given as \"{cell.strip()}\"; the registry has {step.gpu}")
    if not ids:
        return
    starts = {steps[0].id for _, _, steps in facts.parts() if steps}
    ends = {steps[-1].id for _, _, steps in facts.parts() if steps}
    # A row follows the step before it in number, or in its part (were a part ever not contiguous, check 0 says so).
    next_in_part = {a.id: b.id for _, _, steps in facts.parts() for a, b in zip(steps, steps[1:])}
    for a, b in zip(ids, ids[1:]):
        if int(b) != int(a) + 1 and next_in_part.get(a) != b:
            problems.append(f"{path}:{body[0][0]}: the table goes from step {a} to {b}: steps are missing or out of order")
    if ids[0] not in starts or ids[-1] not in ends:
        problems.append(f"{path}:{body[0][0]}: the table lists steps {span(ids)}; a part runs "
                        + "; ".join(span([s.id for s in steps]) for _, _, steps in facts.parts()))


def check_mutant_table(rows: list, facts: Facts, problems: list, path: str) -> None:
    """A table of mutants with a `from step` column: a row for every mutant file that is a mistake (not a
    zero-tile probe), each with its file's step, and no row for a mutant that has no file."""
    col = rows[0][1].index("from step")
    files = {m["name"]: m for m in facts.mutants if m["caught_by"] != "zero-tiles"}
    named = set()
    for number_, cells in rows[2:]:
        name = plain(cells[0]).strip()
        named.add(name)
        if name not in files:
            problems.append(f"{path}:{number_}: mutant {name} has no file in tests/mutants/")
        elif col < len(cells) and cells[col].strip() != files[name]["step"]:
            problems.append(f"{path}:{number_}: mutant {name} is given step {cells[col].strip()}; its file says {files[name]['step']}")
    for name in sorted(set(files) - named):
        problems.append(f"{path}:{rows[0][0]}: the table has no row for the mutant {name} "
                        f"(tests/mutants/{name}.mutant, step {files[name]['step']})")


def minutes_of(time: str) -> int:
    h, m = time.split(":")
    return int(h) * 60 + int(m)


def check_agendas(lines: list, path: str, facts: Facts, problems: list) -> None:
    """Agenda tables: times follow from minutes, exercise slots take their spec's minutes, and each
    'Minutes...: kind N, ...; T in all' line adds up the tables since the one before."""
    totals: dict = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^\| time \| min \| slot \| what \| exercise \|", line):
            i += 2
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append((i + 1, [c.strip() for c in lines[i].strip().strip("|").split("|")]))
                i += 1
            for (n, cells), (n2, nxt) in zip(rows, rows[1:]):
                start, length, slot = cells[0], cells[1], cells[2]
                if not length:
                    problems.append(f"{path}:{n}: a slot without minutes before the end")
                    continue
                if minutes_of(start) + int(length) != minutes_of(nxt[0]):
                    problems.append(f"{path}:{n2}: starts at {nxt[0]}, but the slot before starts at {start} and takes {length} min")
                totals[slot] = totals.get(slot, 0) + int(length)
                exercises = re.findall(r"exercises/(\d\d)_\w+/README\.md\) \((\d+)\)", cells[4] if len(cells) > 4 else "")
                for ex, said in exercises:
                    if facts.minutes.get(ex) != int(said):
                        problems.append(f"{path}:{n}: exercise {ex} is given {said} min; its exercise.spec says {facts.minutes.get(ex)}")
                if slot == "exercise" and exercises and sum(int(s) for _, s in exercises) != int(length):
                    problems.append(f"{path}:{n}: an exercise slot of {length} min for exercises of "
                                    f"{sum(int(s) for _, s in exercises)} min")
            continue
        m = re.match(r"^Minutes[^:]*: (.*); (\d+) in all \((\d+) h (\d+) min\)", line)
        if m:
            said = dict((k, int(v)) for k, v in re.findall(r"([a-z-]+) (\d+)", m.group(1)))
            if said != totals:
                problems.append(f"{path}:{i + 1}: the line says {said}; the tables above add up to {totals}")
            total = int(m.group(2))
            if total != sum(totals.values()) or total != int(m.group(3)) * 60 + int(m.group(4)):
                problems.append(f"{path}:{i + 1}: {total} in all ({m.group(3)} h {m.group(4)} min); the tables add up to "
                                f"{sum(totals.values())}")
            totals = {}
        i += 1


def check_indexed(text: str, rel: str, facts: Facts, problems: list) -> None:
    """`fa_course.steps()[N]` (code included) names the registry's N-th entry, as `fa-run --list` orders them."""
    for m in INDEXED.finditer(text):
        n, said = int(m.group(1)), m.group(2) or m.group(3)
        actual = facts.labels[n] if n < len(facts.labels) else None
        if actual != said:
            problems.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: steps()[{n}] is given as {said}; the "
                            f"registry's entry {n} is {actual or 'past the last'} (look a step up by its label instead)")


def check_tables_name_their_run(text: str, rel: str, problems: list) -> None:
    """Every table of measured numbers (a header in ms, TFLOPS, TB/s or GB/s) names its run: a recorded CSV or runs
    file of docs/results/ within the 10 lines above it or the 10 below it (a generated course table names its CSV in
    its marker). Two numbers for one step and shape from two runs are then each attributed."""
    lines = text.split("\n")
    k = 0
    while k < len(lines):
        if lines[k].startswith("|") and k + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[k + 1].strip()):
            start = k
            while k < len(lines) and lines[k].startswith("|"):
                k += 1
            if MEASURED.search(lines[start]) and not SOURCE.search("\n".join(lines[max(0, start - 10):start] + lines[k:k + 10])):
                problems.append(f"{rel}:{start + 1}: a table of measured numbers that names no run: link the recorded "
                                "CSV or runs file of docs/results/ it comes from (and its GPU) next to it")
            continue
        k += 1


def check_file(path: str, root: str, facts: Facts, problems: list, write: bool) -> None:
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    with open(path, encoding="utf-8") as f:
        original = f.read()
    text = original
    for m in list(BLOCK.finditer(original)):
        gen = GENERATORS.get(m.group(2))
        if gen is None:
            problems.append(f"{rel}:{original.count(chr(10), 0, m.start()) + 1}: no generator called {m.group(2)!r}")
            continue
        wanted = gen(facts, rel, root)
        if m.group(3) != wanted:
            if write:
                text = text.replace(m.group(0), m.group(1) + wanted + m.group(4), 1)
            else:
                problems.append(f"{rel}:{original.count(chr(10), 0, m.start()) + 1}: the generated block {m.group(2)!r} "
                                "differs from what the registry gives: run python3 tools/check_prose.py --write")
    if write and text != original:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{rel}: generated blocks rewritten")
    check_indexed(text, rel, facts, problems)
    check_tables_name_their_run(text, rel, problems)
    # The prose: code fences and generated blocks blanked, line for line.
    lines, blank, in_code = text.splitlines(), [], False
    for line in lines:
        fence = line.lstrip().startswith("```")
        blank.append(in_code or fence)
        in_code = in_code != fence
    for m in BLOCK.finditer(text):
        first, last_line = text.count("\n", 0, m.start()), text.count("\n", 0, m.end())
        for k in range(first, last_line + 1):
            blank[k] = True
    prose = ["" if b else line for line, b in zip(lines, blank)]
    check_agendas(prose, rel, facts, problems)
    # Tables: step tables; other rows' cells are read as clauses.
    paragraphs, current, k = [], [], 0
    while k < len(prose):
        line = prose[k]
        if line.startswith("|"):
            table = []
            while k < len(prose) and prose[k].startswith("|"):
                table.append((k + 1, [c.strip() for c in prose[k].strip().strip("|").split("|")]))
                k += 1
            header = table[0][1]
            if header and header[0] == "step" and "GPU" in header:
                check_step_table(table, facts, problems, rel)
            if header and header[0] == "mutant" and "from step" in header:
                check_mutant_table(table, facts, problems, rel)
            for n, cells in table[2:]:
                for cell in cells:
                    paragraphs.append([(n, cell)])
            continue
        if line.strip():
            current.append((k + 1, line))
        elif current:
            paragraphs.append(current)
            current = []
        k += 1
    if current:
        paragraphs.append(current)
    for para in paragraphs:
        joined, offsets = "", []
        for n, line in para:
            piece = plain(line.lstrip("*#> -").rstrip()) + " "
            offsets.append((len(joined), n))
            joined += piece
        where = lambda pos, offsets=offsets: f"{rel}:{max(n for o, n in offsets if o <= pos)}"  # noqa: E731
        check_claims(joined, where, facts, problems)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--fa-run", help="a built fa-run: read the registry from its --list")
    parser.add_argument("--write", action="store_true", help="rewrite the generated blocks, then check")
    parser.add_argument("--show", action="store_true", help="also print every claim it checked")
    args = parser.parse_args(argv)
    global SHOWN
    SHOWN = [] if args.show else None
    problems: list[str] = []
    ROOT_FOR_FILES[0] = args.root
    facts = read_facts(args.root, args.fa_run, problems)
    check_parts_contiguous(facts, problems)
    files = sorted({p for pattern in PROSE for p in glob.glob(os.path.join(args.root, pattern))})
    for path in files:
        check_file(path, args.root, facts, problems, args.write)
    steps_readmes = sorted(glob.glob(os.path.join(args.root, "steps", "[0-9][0-9]_*", "README.md")))
    for path in steps_readmes:  # the steps' READMEs: their tables name their runs (the claims are checked above)
        with open(path, encoding="utf-8") as f:
            check_tables_name_their_run(f.read(), os.path.relpath(path, args.root).replace(os.sep, "/"), problems)
    for line in SHOWN or []:
        print("checked", line)
    for p in problems:
        print(p)
    print(f"{len(files)} Markdown files and {len(steps_readmes)} step READMEs against {len(facts.steps)} steps "
          f"({'fa-run --list' if args.fa_run else 'read from steps/'}), {len(facts.mutants)} mutants, "
          f"{len(facts.minutes)} exercises: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
