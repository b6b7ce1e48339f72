"""One spelling per meaning across launch_scripts/ (issue 32): the flags are read from each script's source."""
import ast
import re
from pathlib import Path

import pytest

from mgpu_utils.env import REPO_ROOT, SCRIPTS_DIR

# a spelling the course does not use -> the one it uses for that meaning
SYNONYMS = {
    "--batch": "--per-rank-batch (per rank) or --global-batch (all ranks)",
    "--batch-size": "--per-rank-batch",
    "--bs": "--per-rank-batch",
    "--micro": "--micro-batches",
    "--micro-batch": "--micro-batches",
    "--accum-steps": "--micro-batches",
    "--grad-accum": "--micro-batches",
    "--hidden": "--width",
    "--hidden-size": "--width",
    "--embd": "--width",
    "--n-embd": "--width",
    "--dim": "--width",
    "--d-model": "--width",
    "--depth": "--layers",
    "--num-layers": "--layers",
    "--iters": "--repeats (timed calls) or --steps (training steps)",
    "--iterations": "--repeats (timed calls) or --steps (training steps)",
    "--timed": "--steps",
    "--dir": "--ckpt-dir",
    "--checkpoint-dir": "--ckpt-dir",
    "--every": "a name that says what, e.g. --snapshot-every",
    "--parts": "--schedules",
    "--world-size": "torchrun's --nproc-per-node",
}
# flags a script may define with more than about six options only inside argparse groups
MAX_UNGROUPED = 6
CALLERS = ["launch_scripts", "notebooks", "tests", "benchmarks", "docs", "mgpu_utils", "exercises"]


def script_flags(path: Path) -> list[dict]:
    """Every ``add_argument("--flag", ...)`` call in a script: flag, type name, grouped or not."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            kw = {k.arg: k.value for k in node.keywords}
            kind = kw.get("type")
            kind = kind.id if isinstance(kind, ast.Name) else ("flag" if "action" in kw else "str")
            receiver = node.func.value.id if isinstance(node.func.value, ast.Name) else "?"
            for name in names:
                out.append({"flag": name, "type": kind, "receiver": receiver})
    return out


SCRIPTS = sorted(SCRIPTS_DIR.glob("*.py"))


def test_scripts_have_flags():
    flags = {p.name: script_flags(p) for p in SCRIPTS}
    assert len(flags) >= 20 and sum(map(len, flags.values())) > 100, "the parser of the flags found too few"
    assert {f["flag"] for f in flags["pipeline_parallel.py"]} >= {"--global-batch", "--micro-batches", "--width"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_synonym_flags(path):
    bad = [f"{f['flag']} (use {SYNONYMS[f['flag']]})" for f in script_flags(path) if f["flag"] in SYNONYMS]
    assert not bad, f"{path.name} defines " + ", ".join(bad)


def test_one_type_per_flag():
    """A spelling used by several scripts takes the same kind of value in all of them."""
    kinds: dict[str, dict[str, list[str]]] = {}
    for path in SCRIPTS:
        for f in script_flags(path):
            kinds.setdefault(f["flag"], {}).setdefault(f["type"], []).append(path.name)
    mixed = {flag: k for flag, k in kinds.items() if len(k) > 1}
    assert not mixed, f"flags whose value differs in kind between scripts: {mixed}"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_many_flags_are_grouped(path):
    flags = script_flags(path)
    loose = [f["flag"] for f in flags if f["receiver"] != "g"]
    if len(flags) > MAX_UNGROUPED:
        assert not loose, (f"{path.name} has {len(flags)} flags: define them in argparse groups "
                           f"(g = p.add_argument_group(...)); not grouped: {loose}")


def test_callers_use_the_current_spellings():
    """Notebooks, tests, benchmarks and docs pass no flag that the scripts renamed."""
    old = re.compile(r"(?<![\w-])(" + "|".join(re.escape(s) for s in SYNONYMS) + r")(?![\w-])")
    hits = []
    for folder in CALLERS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if (path.suffix not in {".py", ".ipynb", ".md"} or ".ipynb_checkpoints" in path.parts
                    or path == Path(__file__) or not path.is_file()):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for m in old.finditer(line):
                    if "git clone" in line or "torch.distributed.run" in line:
                        continue                  # git's --depth, torchrun's own flags
                    hits.append(f"{path.relative_to(REPO_ROOT)}:{n}: {m.group(1)}")
    for name in ("README.md", "Makefile"):
        for n, line in enumerate((REPO_ROOT / name).read_text().splitlines(), 1):
            hits += [f"{name}:{n}: {m.group(1)}" for m in old.finditer(line) if "git clone" not in line]
    assert not hits, "old flag spellings still passed:\n" + "\n".join(hits)
