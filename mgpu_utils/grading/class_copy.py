"""A copy of the course for students, every lesson and no worked answer (``make class-copy``; docs/instructors.md).

:func:`build` writes the course without what :data:`LEFT_OUT` names (``exercises/solutions/`` and the graders'
tests) and :func:`check_copy` looks for what a student could still read of a worked solution there: its *own* lines
(those no template gives), in any Python file (its code and the text of its strings), Markdown page or notebook
(cell sources and stored outputs), and any mention of ``exercises/solutions/`` that does not say it is the
instructor's. ``make class-copy`` runs both (``python -m mgpu_utils.grading.class_copy DEST``) and fails on a
finding; ``tests/grading/test_class_copy.py`` checks a copy of the working tree.

How a solution is recognised however it is re-typed: the text is cut into logical lines (a statement over
several physical lines is one line), comments and docstrings are dropped, and names are alpha-renamed
(``v0, v1, ...`` in order of first use within a window of ``K`` lines; keywords, builtins, attribute names,
numbers and strings stay). A *shingle* is such a window of ``K`` consecutive lines of a solution that holds
at least one of its own lines; a copy leaks a solution when one of its windows equals a shingle. Renaming a
variable, reflowing a statement or rewording a comment does not hide a copied answer; writing the same
computation another way (another formula, another loop, torch's own API) does, and is what the library does
where a lesson needs an exercise's function (lesson 05's 1F1B, lesson 08's merge).
"""

from __future__ import annotations

import ast
import builtins
import html
import json
import keyword
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Lines per shingle: three logical lines (one line alone is often generic: ``return out, lse``).
K = 3
#: The worked solutions, relative to the course's root (the instructor's copy only).
SOLUTIONS = Path("exercises") / "solutions"
#: What a class copy leaves out: the worked solutions, and the graders' tests (tables of right and wrong
#: solutions written as edits of the worked ones: they need them to run, and the right ones are answers too).
LEFT_OUT = (SOLUTIONS, Path("tests") / "grading")
#: The course's root (mgpu_utils.env.REPO_ROOT, without importing torch: make class-copy runs with any Python).
COURSE = Path(__file__).resolve().parents[2]
#: Files searched for a solution's lines, by suffix.
SEARCHED = (".py", ".ipynb", ".md")
#: A mention of the worked solutions' folder.
MENTION = re.compile(r"(?:\bexercises/|`)solutions/")
#: What makes a mention fine: it says the solutions are the instructor's, or that a class copy leaves them out.
SAYS_WHOSE = re.compile(r"instructor|class[- ]copy", re.I)

_TOKEN = re.compile(r"""
  (?P<comment>\#[^\n]*)
| (?P<string>(?:[rRbBuUfF]{1,2})?(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
| (?P<name>[^\W\d]\w*)
| (?P<number>\d[\w.]*)
| (?P<newline>\n)
| (?P<space>[ \t\f\r]+|\\\n)
| (?P<op>\*\*=?|//=?|->|<<=?|>>=?|\.\.\.|[-+*/%@&|^<>=!:]=|[-+*/%@&|^~<>=()\[\]{}.,:;!])
| (?P<other>.)
""", re.X)
_OPEN, _CLOSE = "([{", ")]}"
STRINGS = " (its strings)"
#: Lines that are no answer on their own, as :func:`_renamed` writes them: imports, decorators, ``def`` and
#: ``class`` headers, a return of plain names, and the optimizer step every training loop has.
GENERIC = re.compile(r"^(?:import |from |@|def |class |return (?:v\d+|None)(?: , (?:v\d+|None))*$"
                     r"|v0 \. (?:zero_grad|backward|step) \()")
_KEEP = set(keyword.kwlist) | set(dir(builtins))


@dataclass(frozen=True)
class Line:
    """One logical line: its tokens (names marked for renaming as ``("name", text)``) and where it starts."""

    tokens: tuple
    lineno: int


def logical_lines(text: str) -> list[Line]:
    """``text`` (Python, or prose with code in it) as logical lines without comments and docstrings.

    Tolerant: prose does not raise (an unmatched quote is one character, a blank line ends any open bracket).

    Returns:
        The logical lines in order; each line's ``tokens`` are strings, except names that are renamed, which
        are ``("name", text)`` pairs: a name after ``.`` (an attribute), a keyword or a builtin is kept. A line
        that is one string alone (a docstring) is left out.
    """
    lines, tokens, kinds, depth, lineno, start = [], [], [], 0, 1, 1

    def end_line():
        if tokens and kinds != ["string"]:
            lines.append(Line(tuple(tokens), start))
        tokens.clear()
        kinds.clear()

    for mo in _TOKEN.finditer(text):
        kind, value = mo.lastgroup, mo.group()
        if kind == "newline":
            lineno += 1
            if depth == 0 or text.startswith("\n", mo.end()):      # a blank line ends an unclosed bracket
                end_line()
                depth = 0
            continue
        if kind in ("space", "comment"):
            lineno += value.count("\n")
            continue
        if not tokens:
            start = lineno
        lineno += value.count("\n")
        renamed = kind == "name" and value not in _KEEP and not (tokens and tokens[-1] == ".")
        tokens.append(("name", value) if renamed else value)
        kinds.append(kind)
        if kind == "op":
            depth = max(0, depth + (value in _OPEN) - (value in _CLOSE))
    end_line()
    return lines


def _renamed(lines) -> str:
    """The lines as one string, names renamed v0, v1, ... in order of first use (alpha-renaming)."""
    names: dict[str, str] = {}
    out = []
    for line in lines:
        out.append(" ".join(names.setdefault(t[1], f"v{len(names)}") if isinstance(t, tuple) else t
                            for t in line.tokens))
    return "\n".join(out)


def own_shingles(solution: str, given: str, k: int = K) -> set[str]:
    """The windows of ``k`` logical lines of ``solution`` that hold one of its own lines, alpha-renamed.

    A line is the solution's own when no line of ``given`` (every template the course gives: a line any template
    has is no answer) equals it, each line renamed on its own, and it is not :data:`GENERIC` (a header, an import,
    a bare return: they name the answer's parts, the body is the answer). A solution with fewer than ``k`` lines
    gives one window, all of it.
    """
    given_lines = {_renamed([line]) for line in logical_lines(given)}
    lines = logical_lines(solution)
    own = [not (text in given_lines or GENERIC.match(text)) for text in (_renamed([line]) for line in lines)]
    if len(lines) < k:
        return {_renamed(lines)} if any(own) else set()
    return {_renamed(lines[i:i + k]) for i in range(len(lines) - k + 1) if any(own[i:i + k])}


@dataclass(frozen=True)
class Finding:
    """What a class copy shows that it should not: ``where`` (file, cell or output, line) and ``what``."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def texts(root: Path):
    """``(where, text)`` for every file :func:`check_copy` reads under ``root``: a Python file gives its text and
    the contents of its strings (:func:`string_contents`), a notebook each cell's source and each stored output
    (its plain text, Markdown, or HTML with the tags dropped), as texts of their own."""
    for path in sorted(p for p in root.rglob("*") if p.suffix in SEARCHED and p.is_file()
                       and not {".git", "__pycache__", ".ipynb_checkpoints", "build", "workspace"} & set(
                           p.relative_to(root).parts)):
        name = path.relative_to(root).as_posix()
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix != ".ipynb":
            yield name, text
            if path.suffix == ".py" and (strings := string_contents(text)):
                yield f"{name}{STRINGS}", strings
            continue
        for i, cell in enumerate(json.loads(text)["cells"]):
            yield f"{name} cell {i}", "".join(cell["source"])
            for j, out in enumerate(cell.get("outputs", [])):
                parts = ["".join(out.get("text", ""))]
                for mime, value in out.get("data", {}).items():
                    value = "".join(value) if isinstance(value, list) else value
                    if mime == "text/html":
                        parts.append(html.unescape(re.sub(r"<[^>]+>", "", value)))
                    elif mime.startswith("text/"):
                        parts.append(value)
                yield f"{name} cell {i} output {j}", "\n".join(p for p in parts if p)


def string_contents(source: str) -> str:
    """The contents of the string literals of the Python ``source`` as one text, each starting on its own line
    of ``source`` where it can (so a finding names about the right line): a solution kept as text, e.g.
    ``BODY = "    warmup = ...\\n"``, is read as code. "" when ``source`` does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    lines: list[str] = []
    for lineno, _, value in sorted((node.lineno, node.col_offset, node.value) for node in ast.walk(tree)
                                   if isinstance(node, ast.Constant) and isinstance(node.value, str)):
        lines += [""] * (lineno - 1 - len(lines)) + value.split("\n")
    return "\n".join(lines) if any(lines) else ""


def solution_shingles(course: Path, k: int = K) -> dict[str, set[str]]:
    """Per worked solution of ``course`` (its file name in the instructor's ``exercises/solutions/``), its own
    shingles (:func:`own_shingles`, against every template in ``exercises/``).

    Raises:
        FileNotFoundError: ``course`` has no ``exercises/solutions/`` (a class copy: pass the instructor's copy).
    """
    folder = course / SOLUTIONS
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: the worked solutions are in the instructor's copy "
                                "of the course; pass that copy's root")
    given = "\n\n".join(p.read_text() for p in sorted((course / "exercises").glob("*.py")))
    return {p.name: own_shingles(p.read_text(), given, k) for p in sorted(folder.glob("*.py"))}


def check_copy(copy: Path, solutions_from: Path, k: int = K) -> list[Finding]:
    """Everything in the class copy ``copy`` that shows a worked solution of ``solutions_from`` (the instructor's
    course root): every window of ``k`` logical lines equal to a solution's own shingle, and every mention of
    ``exercises/solutions/`` on a line that does not say whose they are (the instructor's) or that a class copy
    leaves them out. An empty list: nothing to read there.
    """
    shingles = {s: name for name, found in solution_shingles(solutions_from, k).items() for s in found}
    findings = [Finding(folder.as_posix(), "a class copy leaves this folder out") for folder in LEFT_OUT
                if (copy / folder).exists()]
    for where, text in texts(copy):
        lines = logical_lines(text)
        seen = set()
        for i in range(max(1, len(lines) - k + 1)):
            window = _renamed(lines[i:i + k])
            name = shingles.get(window)
            if name and name not in seen:
                seen.add(name)
                findings.append(Finding(f"{where} line {lines[i].lineno}",
                                        f"lines of the worked solution {name}: {window.splitlines()[0][:60]} ..."))
        if not where.endswith(STRINGS):
            findings += [Finding(f"{where} line {n}", f"points at the worked solutions: {sentence[:80]}")
                         for n, sentence in unexplained_mentions(text)]
    return findings


def unexplained_mentions(text: str) -> list[tuple[int, str]]:
    """``(line, sentence)`` for every sentence of ``text`` that names the worked solutions' folder
    (:data:`MENTION`) without saying whose they are or that a class copy leaves them out (:data:`SAYS_WHOSE`);
    a sentence runs to a full stop followed by a space, or to a blank line."""
    found, lineno = [], 1
    for paragraph in re.split(r"(\n\s*\n)", text):
        if MENTION.search(paragraph):
            offset = 0
            for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
                offset = paragraph.index(sentence, offset)
                if MENTION.search(sentence) and not SAYS_WHOSE.search(sentence):
                    found.append((lineno + paragraph.count("\n", 0, offset), " ".join(sentence.split())))
        lineno += paragraph.count("\n")
    return found


def tracked_files(course: Path) -> list[str]:
    """The files git tracks in ``course`` (the working tree's, committed or not), as relative paths."""
    out = subprocess.run(["git", "-C", str(course), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def build(course: Path, dest: Path, from_commit: bool = True) -> None:
    """Write the class copy of ``course`` into ``dest`` (new or empty): the last commit (``git archive HEAD``), or
    with ``from_commit=False`` the files git tracks as they are in the working tree (uncommitted edits
    included); without the folders of :data:`LEFT_OUT`.

    Raises:
        FileExistsError: ``dest`` holds files (give a new folder).
    """
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty: give a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    if from_commit:
        archive = subprocess.run(["git", "-C", str(course), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    else:
        for name in tracked_files(course):
            source = course / name
            if source.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    for folder in LEFT_OUT:
        shutil.rmtree(dest / folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m mgpu_utils.grading.class_copy DEST``: build the class copy of this course in DEST, check it.

    Returns 0 with a clean copy; 1 with the findings printed (the copy stays, to look at); 2 on a bad DEST.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: make class-copy DEST=folder (a new or empty folder)")
        return 2
    dest = Path(argv[0]).resolve()
    try:
        build(COURSE, dest)
    except FileExistsError as e:
        print(e)
        return 2
    findings = check_copy(dest, COURSE)
    commit = subprocess.run(["git", "-C", str(COURSE), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if findings:
        print(f"{dest}: the class copy shows worked answers ({len(findings)}); fix them before you hand it out:")
        print("\n".join(f"  {f}" for f in findings))
        return 1
    print(f"{dest}: the course at commit {commit}, without {' and '.join(f'{p.as_posix()}/' for p in LEFT_OUT)}; "
          f"checked: no worked solution's own lines in it ({K}-line windows, names renamed) and no mention of "
          f"exercises/solutions/ but the instructor's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
