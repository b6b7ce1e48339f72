"""The course's own code, read in a lesson: the lines of a launch script (or of ``mgpu_utils``) that a
lesson runs, shown highlighted above the cell that launches them (:func:`show_code`, lessons 00-12), and
a launch script as a module, to call its functions in a notebook (:func:`load_script`, lessons 04, 06,
09, 10).

A launch script marks the part of a longer function that a lesson teaches with two comments::

    # region snapshot
    ...
    # endregion

and the lesson shows it with ``show_code("elastic_train.py", region="snapshot")``. Whole functions and
classes (``"run_ps"``, ``"Block.forward"``) need no marker. The code is read from the file, never run.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
import io
import textwrap
import tokenize
from pathlib import Path

from mgpu_utils.env import REPO_ROOT, SCRIPTS_DIR

WIDTH = 100          # characters a lesson's code and output lines keep to (tests/repo/test_notebook_views.py)
_REGION = re.compile(r"^\s*# region (?P<name>[\w-]+)\s*$")
_END = re.compile(r"^\s*# endregion\b")


def _script_path(script: str | Path) -> Path:
    path = Path(script)
    if not path.is_absolute() and len(path.parts) > 1:            # a file of the course: cluster/slurm/job.sbatch
        path = REPO_ROOT / path
    elif not path.is_absolute():
        path = SCRIPTS_DIR / (path.name if path.suffix == ".py" else f"{path.name}.py")
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in SCRIPTS_DIR.glob("*.py")))
        raise FileNotFoundError(f"no launch script {path.name} in {SCRIPTS_DIR.name}/: one of {known}")
    return path


def _shown_path(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return path.name


def regions(text: str) -> dict[str, tuple[int, int]]:
    """The ``# region NAME`` ... ``# endregion`` blocks of a source text: {name: (first, last)}, the
    1-based line numbers of the code between the two markers.

    Raises:
        ValueError: a region that is not closed, is opened inside another, or has a name used twice.
    """
    found, open_name, first = {}, None, 0
    for n, line in enumerate(text.splitlines(), 1):
        m = _REGION.match(line)
        if m:
            if open_name:
                raise ValueError(f"line {n}: region {m['name']!r} opens inside region {open_name!r}")
            if m["name"] in found:
                raise ValueError(f"line {n}: region {m['name']!r} is defined twice")
            open_name, first = m["name"], n + 1
        elif _END.match(line):
            if not open_name:
                raise ValueError(f"line {n}: '# endregion' without a '# region NAME' before it")
            found[open_name], open_name = (first, n - 1), None
    if open_name:
        raise ValueError(f"region {open_name!r} (line {first - 1}) has no '# endregion'")
    return found


def definitions(text: str) -> dict[str, tuple[int, int]]:
    """Top-level functions and classes and the methods of those classes: {"name" or "Class.method":
    (first, last)}, 1-based line numbers, decorators included."""
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = (first, node.end_lineno)
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        first = min([sub.lineno] + [d.lineno for d in sub.decorator_list])
                        out[f"{node.name}.{sub.name}"] = (first, sub.end_lineno)
    return out


def fit_comments(code: str, width: int = WIDTH) -> str:
    """Move the trailing comment of each line longer than ``width`` onto its own line above, at the
    line's indentation, so that a listing fits the page; the code itself is not changed. Code that does
    not tokenize (a fragment cut mid-statement) is returned as it is."""
    lines = code.split("\n")
    moves = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            row, col = tok.start
            if (tok.type == tokenize.COMMENT and len(lines[row - 1]) > width
                    and lines[row - 1][:col].strip()):
                moves[row - 1] = col
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if i not in moves:
            out.append(line)
            i += 1
            continue
        col, indent = moves[i], line[:len(line) - len(line.lstrip())]
        comment = [line[col:].strip()]
        # the comment's continuation lines (comments alone, aligned under it) go up with it
        while (i + 1 < len(lines) and i + 1 not in moves and lines[i + 1][:col].strip() == ""
               and lines[i + 1][col:].startswith("#")):
            i += 1
            comment.append(lines[i].strip())
        out += [indent + c for c in comment] + [line[:col].rstrip()]
        i += 1
    return "\n".join(out)


def read_code(what, *names: str, region: str | tuple[str, ...] = ()) -> str:
    """The source text :func:`show_code` shows: each part under a comment that says where it is.

    Args:
        what: a launch script's file name (``"sync_async.py"``, the ``.py`` optional), another file of the
            course by its path (``"cluster/slurm/job.sbatch"``: regions only, ``#`` comments), or a function,
            class or module (of ``mgpu_utils`` or a script from :func:`load_script`).
        names: functions or classes of the script (``"run_ps"``, ``"Block.forward"``), in the order shown;
            after a function, class or module, more of them as objects (``show_code(f, g)``).
        region: one ``# region NAME`` block name, or several, shown after the names.

    Returns:
        the parts, dedented, each under ``# FILE, lines A-B``, separated by a blank line (str); a
        trailing comment that makes a line longer than :data:`WIDTH` stands on its own line above it.

    Raises:
        FileNotFoundError: no such launch script (the message lists them).
        ValueError: a name or region that the file does not have (the message lists those it has),
            nothing asked for in a script (a script is shown in parts, never whole), or names given as
            strings after an object.
    """
    if not isinstance(what, (str, Path)):
        if region or any(isinstance(n, (str, Path)) for n in names):
            raise ValueError("with a function, class or module, name more of them as objects "
                             "(show_code(f, g)), not by name or region: those are for a script")
        parts = []
        for obj in (what, *names):
            lines, first = inspect.getsourcelines(obj)
            path = Path(inspect.getsourcefile(obj))
            head = f"# {_shown_path(path)}, lines {first}-{first + len(lines) - 1}"
            parts.append(head + "\n" + fit_comments(textwrap.dedent("".join(lines)).rstrip("\n")))
        return "\n\n".join(parts)
    path = _script_path(what)
    text = path.read_text()
    wanted = [(n, False) for n in names] + [(r, True) for r in ([region] if isinstance(region, str) else region)]
    defs = definitions(text) if path.suffix == ".py" else {}
    regs, lines, parts = regions(text), text.splitlines(), []
    if not wanted:
        raise ValueError(f"say which part of {path.name} to show: a function name or region=NAME "
                         f"(functions: {', '.join(defs) or 'none'}; regions: {', '.join(regs) or 'none'})")
    for name, is_region in wanted:
        table = regs if is_region else defs
        if name not in table:
            kind = "region" if is_region else "function or class"
            raise ValueError(f"{path.name} has no {kind} {name!r}: it has functions {', '.join(defs)}; "
                             f"regions {', '.join(regs) or 'none'}")
        first, last = table[name]
        body = fit_comments(textwrap.dedent("\n".join(lines[first - 1:last])))
        parts.append(f"# {_shown_path(path)}, lines {first}-{last}\n{body}")
    return "\n\n".join(parts)


class Listing:
    """Code shown in a notebook: highlighted as Python (Markdown) where a front end renders it, the plain
    text elsewhere (a terminal, ``nbconvert --to script``)."""

    def __init__(self, text: str, language: str = "python"):
        self.text, self.language = text, language

    def _repr_markdown_(self) -> str:
        return f"```{self.language}\n{self.text}\n```"

    def __repr__(self) -> str:
        return self.text


def show_code(what, *names: str, region: str | tuple[str, ...] = ()) -> None:
    """Show the lines a lesson is about to run, highlighted (lessons 00-12; arguments as :func:`read_code`).

    In a notebook it displays the code under the cell; elsewhere it prints it. Returns nothing, so it
    may end a cell without showing the code twice.
    """
    shell = isinstance(what, (str, Path)) and Path(what).suffix in (".sh", ".sbatch")
    listing = Listing(read_code(what, *names, region=region), "bash" if shell else "python")
    if "IPython" in sys.modules:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(listing)
            return
    print(listing.text)


def load_script(script: str | Path):
    """A launch script as a module, to call its functions in a notebook (lessons 04, 06, 09, 10).

    Its ``main()`` does not run (every script calls it under ``if __name__ == "__main__"``). Loaded once
    per kernel, under the script's own name (``load_script("sync_async.py")`` is module ``sync_async``).

    Raises:
        FileNotFoundError: no such launch script (the message lists them).
    """
    path = _script_path(script)
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path.resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module                  # before running it: dataclasses and pickle look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
