"""References between lessons stay true when lessons move: the files a text names exist, every lesson's title,
exercise ids and "Next:" line agree with its file number, and a "lesson NN" beside a topic names the lesson that
teaches it (issue 54: context and expert parallelism moved from 12 to 08, and 08-11 one place down).
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBERS = [nb.name[:2] for nb in NOTEBOOKS]

#: Terms only one lesson teaches: a "lesson NN" in the same clause as one of them must name that lesson.
TERMS = {
    "05": ["1F1B", "GPipe", "pipeline schedule"],
    "07": ["ZeRO-1", "memory calculator"],
    "08": ["ring attention", "Ulysses", "expert parallel", "mixture of experts", "mixture-of-experts",
           "context parallel", "zig-zag"],
    "09": ["local SGD", "parameter server", "PowerSGD", "staleness", "DiLoCo", "straggler"],
    "10": ["GAN", "BERT", "ResNet", "critical batch", "34 days"],
    "11": ["FlopCounterMode", "profiler", "strong scaling", "weak scaling", "scaling study", "energy"],
    "12": ["snapshot", "Slurm", "elastic", "requeue", "Young's"],
    "13": ["parity matrix", "fake process group", "planted bug"],
}
#: Notebook names that tests make up for their own temporary folders.
FIXTURES = {"01_ok", "02_bad", "99_x", "01_gpu", "01_a", "02_b"}
MENTION = re.compile(r"\b[Ll]essons? ((?:1[0-3]|0?\d)(?:(?:,\s+|\s+and\s+|\s+or\s+|/)(?:1[0-3]|0?\d))*)\b(?![.\d-])")


def texts():
    """(where, text) for every tracked text file; a notebook gives one text per cell (its source)."""
    paths = [ROOT / n for n in ("README.md", "Makefile", "pyproject.toml", "environment.yml")]
    for folder in ("docs", "notebooks", "exercises", "mgpu_utils", "launch_scripts", "benchmarks", "cluster", "tests",
                   ".ci", "jupyter"):
        paths += sorted(p for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts
                        and ".ipynb_checkpoints" not in p.parts)
    for path in paths:
        name = path.relative_to(ROOT).as_posix()
        if path.suffix not in (".md", ".py", ".ipynb", ".sh", ".sbatch", ".toml", ".yml", ".cfg", "") \
                or not path.is_file() or name == "tests/repo/test_references.py":
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb":
            for i, cell in enumerate(json.loads(text)["cells"]):
                yield f"{name} cell {i}", "".join(cell["source"])
        else:
            yield name, text


def stale_mentions(text):
    """The "lesson NN" mentions in ``text`` whose clause names a term another lesson teaches: [(mention, term)]."""
    found = []
    for mo in MENTION.finditer(text):
        named = {n.zfill(2) for n in re.findall(r"\d+", mo.group(1))}
        before = re.split(r"[,;().:\n]", text[max(0, mo.start() - 80):mo.start()])[-1]
        after = re.split(r"[,;).:\n]", text[mo.end():mo.end() + 80])[0]
        clause = before + " " + after
        for lesson, terms in TERMS.items():
            for term in terms:
                if lesson not in named and re.search(r"\b" + re.escape(term), clause):
                    found.append((mo.group(0) + " ..." + clause.strip()[:60], term))
    return found


def test_the_check_catches_a_stale_mention():
    assert [term for _, term in stale_mentions("as lesson 12 merges ring attention")] == ["ring attention"]
    assert stale_mentions("(Kaplan et al., 2020; lesson 10 counts it with `FlopCounterMode`)")
    assert not stale_mentions("(Kaplan et al., 2020; lesson 11 counts it with `FlopCounterMode`)")
    assert not stale_mentions("lessons 08 and 11 use ring attention and a profiler")


def test_a_lesson_mentioned_beside_a_topic_is_the_lesson_that_teaches_it():
    bad = [f"{where}: {mention} (names {term!r})" for where, text in texts() for mention, term in stale_mentions(text)]
    assert not bad, "stale lesson references:\n" + "\n".join(bad)


def test_every_lesson_or_exercise_file_named_exists():
    names = {p.name for p in NOTEBOOKS} | {p.name for p in (ROOT / "exercises").glob("*.py")}
    stems = {n.rsplit(".", 1)[0] for n in names}
    bad = []
    for where, text in texts():
        for mo in re.finditer(r"(?<![\w/.-])(?:notebooks/|exercises/(?:solutions/)?)?(\d\d_[a-z0-9_]+)(\.ipynb|\.py)?\b",
                              text):
            stem, suffix = mo.group(1), mo.group(2)
            if not suffix and "/" not in mo.group(0):
                continue                                  # a bare stem is checked only with a path or suffix
            if stem not in stems and stem not in FIXTURES:
                bad.append(f"{where}: {mo.group(0)}")
    assert not bad, "files that do not exist:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_title_ids_and_next_follow_the_file_number(notebook):
    number = notebook.name[:2]
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]]
    assert cells[0].startswith(f"# {number} · "), f"{notebook.name}: the title does not start with '# {number} · '"
    ids = re.findall(r'\bcheck(?:_script)?\("(\d\d)\.\d+"', "\n".join(cells))
    assert ids and set(ids) == {number}, f"{notebook.name} checks exercises of lessons {sorted(set(ids))}"
    following = NUMBERS.index(number) + 1
    nexts = [n for c in cells for n in re.findall(r"Next: (?:lesson (\d\d)|`(\d\d)_)", c)]
    if following < len(NOTEBOOKS):
        assert all(NUMBERS[following] in pair for pair in nexts), \
            f"{notebook.name}: 'Next:' points to {nexts}, the next lesson is {NUMBERS[following]}"
    else:
        assert not nexts, f"{notebook.name} is the last lesson but points to {nexts}"


def _lesson_minutes() -> dict[str, tuple]:
    """Per lesson number: (README's minutes, docs/lessons.md's minutes, docs/syllabus.md's seconds)."""
    readme = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^\| \[`(\d\d)_\w+\.ipynb`\]\([^)]*\) \| [^|]* \| ([\d.]+) \|", (ROOT / "README.md").read_text(), re.M)}
    lessons = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^## (\d\d) .*?^Minutes on CPU: ([\d.]+)\.", (ROOT / "docs" / "lessons.md").read_text(), re.M | re.S)}
    syllabus = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^\| (\d\d) [^|]* \| (\d+) \| \d+ \|", (ROOT / "docs" / "syllabus.md").read_text(), re.M)}
    return {n: (readme.get(n), lessons.get(n), syllabus.get(n)) for n in sorted({*readme, *lessons, *syllabus})}


def test_the_three_places_that_state_lesson_times_agree():
    """Issue 61: README's minutes, docs/lessons.md's minutes and docs/syllabus.md's seconds are one measurement
    (make course), for every lesson in notebooks/."""
    notebooks = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    times = _lesson_minutes()
    assert set(times) == notebooks, set(times) ^ notebooks
    bad = {n: t for n, t in times.items() if None in t or t[0] != t[1] or abs(t[2] / 60 - t[0]) > 0.051}
    assert not bad, bad


def test_the_exercise_tables_list_every_graded_exercise():
    """Issue 61: exercises/README.md (id, lesson, template), docs/syllabus.md (ids per lesson) and
    docs/instructors.md (every id) agree with the grading catalog."""
    from mgpu_utils.grading.catalog import EXERCISES

    table = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| (\d\d\.\d) \| (\d\d) [^|]* \| `([\w.]+)` \|", (ROOT / "exercises" / "README.md").read_text(), re.M)}
    assert table == {i: (i[:2], e.template) for i, e in EXERCISES.items()}
    syllabus = (ROOT / "docs" / "syllabus.md").read_text()
    rows = {m.group(1): set(re.findall(r"\b\d\d\.\d\b", m.group(2)))
            for m in re.finditer(r"^\| (\d\d) [^|]* \|(?:[^|]*\|){3}([^|]*)\|$", syllabus, re.M)}
    by_lesson = {}
    for i in EXERCISES:
        by_lesson.setdefault(i[:2], set()).add(i)
    assert {n: ids for n, ids in rows.items() if ids} == by_lesson
    instructors = (ROOT / "docs" / "instructors.md").read_text()
    named = set(re.findall(r"\b\d\d\.\d\b", instructors))
    for lesson, first, last in re.findall(r"\b(\d\d)\.(\d)-\1\.(\d)\b", instructors):   # 03.4-03.6: a range
        named |= {f"{lesson}.{k}" for k in range(int(first), int(last) + 1)}
    assert set(EXERCISES) <= named, set(EXERCISES) - named
