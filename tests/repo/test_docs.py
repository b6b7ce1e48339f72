"""The README is the front door and docs/ holds the rest (issue 30): the README stays short, every relative
link and anchor in README.md and docs/*.md leads somewhere, every docs page is reachable from the README, and
every file or module of the repository they name exists (so a renamed or regrouped module fails here, not in
a reader's hands)."""
import ast
import os
import re
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

import pytest

from mgpu_utils.grading.class_copy import LEFT_OUT, SOLUTIONS

ROOT = Path(__file__).resolve().parents[2]
#: A class copy (make class-copy): the docs name what it leaves out (the worked solutions, the graders' tests).
CLASS_COPY = not (ROOT / SOLUTIONS).is_dir()
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_CHARS = 10_000

# `make mutation` runs the in-process tests in mutmut's copy of the repository (mutants/), which holds only
# what [tool.mutmut] also_copy lists: these tests check documents, not the mutated code, so they stand aside.
pytestmark = pytest.mark.skipif("MUTANT_UNDER_TEST" in os.environ or ROOT.name == "mutants",
                                reason="mutmut's copy of the repository: documents are not mutated")

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)       # [label]: target
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# a path inside the repository (not a link target: those are checked by test_relative_links_resolve)
REPO_PATH = re.compile(r"(?<![\w./<-])((?:mgpu_utils|tests|benchmarks|launch_scripts|notebooks|exercises|jupyter|docs|\.ci)"
                       r"/[\w./*-]*)")
MODULE = re.compile(r"(?<![\w./-])mgpu_utils(?:\.\w+)+")


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _prose(markdown: str) -> str:
    """The markdown without its fenced code blocks (a link inside a code block is not a link)."""
    out, fence = [], None
    for line in markdown.splitlines():
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
            fence = None if fence else m.group(1)
            out.append("")
            continue
        out.append("" if fence else line)
    return "\n".join(out)


def links(markdown: str) -> list[str]:
    """Every link target of ``markdown``: inline links, images and reference definitions, outside code blocks."""
    prose = _prose(markdown)
    return [m.group(1) for m in LINK.finditer(prose)] + [m.group(1) for m in REF_LINK.finditer(prose)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)         # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).lower()                        # inline HTML
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub makes for the headings of ``markdown`` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(markdown).splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page: Path, markdown: str | None = None) -> list[str]:
    """The relative links of ``page`` (or of ``markdown``, read as if it were ``page``) that lead nowhere."""
    markdown = page.read_text() if markdown is None else markdown
    bad = []
    for target in links(markdown):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target):                   # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{_rel(page)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md":
            text = markdown if dest == page else dest.read_text()
            if unquote(anchor).lower() not in anchors(text):
                bad.append(f"{_rel(page)}: {target} (no heading with anchor #{anchor} in {_rel(dest)})")
    return bad


@lru_cache(maxsize=None)
def _module_names(path: Path) -> dict[str, set[str]]:
    """Names defined at the top of the module ``path`` (key ""), and inside each of its classes (key: class)."""
    tree = ast.parse(path.read_text())
    names: dict[str, set[str]] = {"": set()}

    def defined(body) -> set[str]:
        found = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                found |= defined([n for part in ("body", "orelse", "finalbody") for n in getattr(node, part, [])])
        return found

    names[""] = defined(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = defined(node.body)
    return names


def missing_module(dotted: str) -> str | None:
    """Why ``mgpu_utils.a.b.name`` does not exist in the tree, or None when it does.

    The longest prefix that is a module or package of the tree is the module; what follows must be a name
    defined in it (a function, class, constant or import), optionally followed by a name in that class.
    """
    parts = dotted.split(".")
    module, rest = None, []
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                module, rest = candidate, parts[i:]
                break
        if module:
            break
    if module is None:
        return f"{dotted}: no module {parts[0]}"
    if not rest:
        return None
    names = _module_names(module)
    if rest[0] not in names[""]:
        return f"{dotted}: {_rel(module)} defines no {rest[0]!r}"
    if len(rest) >= 2 and rest[0] in names and rest[1] not in names[rest[0]]:
        return f"{dotted}: class {rest[0]} in {_rel(module)} has no {rest[1]!r}"
    return None


def missing_paths(markdown: str) -> list[str]:
    """The repository paths (``mgpu_utils/launch/warm.py``, ``tests/``, ``launch_scripts/*.py``) named in
    ``markdown`` that are not in the tree."""
    bad = []
    for m in REPO_PATH.finditer(markdown):
        path = m.group(1).rstrip(".,;:")
        if CLASS_COPY and any(path.startswith(f"{folder.as_posix()}/") for folder in LEFT_OUT):
            continue                                      # a class copy leaves these out on purpose
        if "*" in path:
            if not list(ROOT.glob(path)):
                bad.append(f"{path} (matches nothing)")
        elif not (ROOT / path).exists():
            bad.append(path)
    return bad


def unclosed_tables(markdown: str) -> list[int]:
    """Lines where a table runs into a line of prose (the same rule as tests/repo/test_notebook_views.py)."""
    lines = _prose(markdown).splitlines()
    return [n + 1 for n, (line, nxt) in enumerate(zip(lines, lines[1:]), 1)
            if line.lstrip().startswith("|") and nxt.strip() and not nxt.lstrip().startswith("|")]


# ---- the checks on the helpers themselves: each must fail on what it is there to catch ----------------------

def test_the_checks_catch_what_they_are_for(tmp_path):
    assert slug("The launcher") == "the-launcher"
    assert slug("`make lab`: a quiet start") == "make-lab-a-quiet-start"
    assert slug("DDP-vs-one-process checks on Ampere or newer GPUs") == "ddp-vs-one-process-checks-on-ampere-or-newer-gpus"
    assert slug("Timing claims hold on your machine, busy or not") == "timing-claims-hold-on-your-machine-busy-or-not"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert links("[x](a.md) ![i](b.png) `code` [y](https://e.org)\n```\n[z](c.md)\n```\n[r]: d.md\n") == \
        ["a.md", "b.png", "https://e.org", "d.md"]
    assert links("[`00_setup.ipynb`](notebooks/00_setup.ipynb)") == ["notebooks/00_setup.ipynb"]

    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n## A section\n")
    page.write_text("# Page\n[ok](other.md) [ok](other.md#a-section) [ok](#page) [web](https://example.org/x)\n")
    assert broken_links(page) == []
    page.write_text("# Page\n[gone](missing.md) [bad anchor](other.md#no-such) [self](#nowhere)\n")
    assert len(broken_links(page)) == 3

    assert missing_module("mgpu_utils.launch.launcher.launch") is None
    assert missing_module("mgpu_utils.launch.warm.close_template") is None
    assert missing_module("mgpu_utils.timing.LoadWatch") is None
    assert missing_module("mgpu_utils.launcher")                       # the module before the regrouping
    assert missing_module("mgpu_utils.exercises")
    assert missing_module("mgpu_utils.launch.launcher.no_such_function")
    assert missing_paths("`mgpu_utils/launch/warm.py`, `launch_scripts/*.py` and `tests/`.") == []
    assert missing_paths("see mgpu_utils/launcher.py and mgpu_utils/plots.py") == \
        ["mgpu_utils/launcher.py", "mgpu_utils/plots.py"]
    assert unclosed_tables("| a |\n|---|\n| 1 |\nprose\n") == [4]


# ---- the checks on README.md and docs/ ----------------------------------------------------------------------

def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text) <= MAX_README_CHARS, (
        f"README.md has {len(text):,} characters (at most {MAX_README_CHARS:,}): move the details into a page "
        "under docs/ and link it")
    assert DOCS, "docs/ has no pages"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / unquote(t.partition("#")[0])).resolve() for t in links(README.read_text())}
    unlinked = [_rel(p) for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"pages under docs/ that README.md does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    bad = broken_links(page)
    assert not bad, "links that lead nowhere:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_files_and_modules_exist(page):
    text = page.read_text()
    bad = missing_paths(text)
    bad += [why for name in sorted(set(MODULE.findall(text))) if (why := missing_module(name))]
    assert not bad, f"{_rel(page)} names what is not in the tree (renamed or moved?):\n" + "\n".join(bad)


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_docs_tables_end_with_a_blank_line(page):
    assert not unclosed_tables(page.read_text()), f"{_rel(page)}: a table runs into the next line"


def test_every_page_naming_the_nccl_interface_names_the_gloo_one():
    """An NCCL job of the course also starts gloo (its default group is cpu:gloo,cuda:nccl), and gloo connects
    every pair of ranks at init, at the address the host name resolves to unless GLOO_SOCKET_IFNAME names the
    interface: a page that tells a reader to set NCCL_SOCKET_IFNAME alone leaves that hang in place (G6)."""
    from mgpu_utils.dist import GROUP_BACKENDS

    assert "gloo" in GROUP_BACKENDS["nccl"]
    pages = [*PAGES, ROOT / "cluster" / "README.md"]
    naming = [p for p in pages if "NCCL_SOCKET_IFNAME" in p.read_text()]
    assert ROOT / "docs" / "troubleshooting.md" in naming
    assert [_rel(p) for p in naming if "GLOO_SOCKET_IFNAME" not in p.read_text()] == []
