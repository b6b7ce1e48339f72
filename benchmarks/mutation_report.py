"""Score of the last `mutmut run` per module (run by `make mutation`; not part of `make test`).

A mutant is a copy of the code with one small change (an operator flipped, a constant changed, an
argument dropped). The suite *kills* it when some test fails (or hangs past mutmut's time limit). The
score of a module is killed / (mutants - equivalent), where an equivalent mutant changes nothing a
caller can observe and is listed, with the reason, in tests/mutation_equivalent.txt (one
``mutant_name  # reason`` per line).
Every other survivor is printed: each one is a bug the tests would not catch.

Reads mutmut's result files (mutants/**/*.py.meta). Exits 1 when a gated module scores below --min
(default 0.9), or when an equivalent-list entry names a mutant that no longer exists.

Run:
    make mutation
"""
import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED = {1, 3}          # a test failed (3: pytest internal error, also a kill), as mutmut counts them
TIMEOUT = {24, 36, 152, 255, -24}   # the mutant made a test hang past mutmut's limit: detected, so killed
SURVIVED = {0}
NO_TESTS = {5, 33}       # no test reaches the mutated function: a survivor too


def load_equivalent(path: Path) -> dict:
    """{mutant name: reason} from the list of equivalent mutants."""
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition("#")
            out[name.strip()] = reason.strip()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min", type=float, default=0.9, help="minimum score of every gated module")
    p.add_argument("--gate", nargs="*", default=["memory_model", "planner", "schedules",
                                                  "bandwidth", "interconnect", "staleness"],
                   help="modules (file stems) that must reach --min")
    a = p.parse_args()
    metas = sorted((ROOT / "mutants").rglob("*.py.meta"))
    if not metas:
        print("no mutmut results under mutants/: run `make mutation` (or `mutmut run`) first")
        return 1
    equivalent = load_equivalent(ROOT / "tests" / "mutation_equivalent.txt")
    seen, failed = set(), []
    print(f"{'module':<16} {'mutants':>7} {'killed':>6} {'survived':>8} {'equivalent':>10} {'score':>6}")
    survivors = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        module = meta.name.removesuffix(".py.meta")
        if not codes:
            continue
        seen |= set(codes)
        count = Counter()
        for name, code in codes.items():
            if name in equivalent:
                count["equivalent"] += 1
            elif code in KILLED or code in TIMEOUT:
                count["killed"] += 1
            else:
                count["survived"] += 1
                kind = "no test reaches it" if code in NO_TESTS else ("not run" if code is None else f"exit {code}")
                survivors.append(f"{name} ({kind})")
        judged = len(codes) - count["equivalent"]
        score = count["killed"] / judged if judged else 1.0
        print(f"{module:<16} {len(codes):>7} {count['killed']:>6} {count['survived']:>8} {count['equivalent']:>10} "
              f"{score:>6.1%}")
        if module in a.gate and score < a.min:
            failed.append(f"{module}: {score:.1%} < {a.min:.0%}")
    stale = sorted(set(equivalent) - seen)
    if survivors:
        print("\nsurviving mutants (see one with `mutmut show NAME`):")
        print("\n".join("  " + s for s in survivors))
    if stale:
        failed.append(f"tests/mutation_equivalent.txt lists mutants that no longer exist: {stale}")
    if failed:
        print("\nFAILED: " + "; ".join(failed))
        return 1
    print(f"\nevery gated module reaches {a.min:.0%} (equivalent mutants excluded, listed with reasons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
