"""Text for people: long lines broken at spaces, to at most :data:`LINE_WIDTH` characters (every lesson's messages,
the launcher's errors, the graders' hints; lessons 10 and 12 print long messages with it).

No torch, no distributed runtime: a module that only wraps lines imports this one.
"""

from __future__ import annotations

import textwrap

#: Longest output line the course prints (JupyterLab wraps longer ones mid-word), in characters.
LINE_WIDTH = 100


def wrap_text(text: str, width: int = LINE_WIDTH, indent: str = "  ", first: int = 0) -> str:
    """``text`` with every line longer than ``width`` characters broken at spaces (never inside a word).

    A continuation line starts with its line's own leading spaces plus ``indent``; lines that fit, and
    the line breaks already in ``text``, stay as they are. A word longer than a line stays whole.

    Args:
        text: one or more lines.
        width: the longest line, in characters.
        indent: what continuation lines add in front.
        first: characters that the caller prints in front of the first line (e.g. ``"ValueError: "``):
            the first line is that much shorter.

    Returns:
        The wrapped text (lines joined by ``"\\n"``, no trailing newline added).
    """
    out = []
    for i, line in enumerate(str(text).split("\n")):
        pad = " " * first if i == 0 else ""
        if len(pad + line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip(" "))]
        lines = textwrap.wrap(line.lstrip(" "), width, initial_indent=pad + lead, subsequent_indent=lead + indent,
                              break_long_words=False, break_on_hyphens=False)
        out += [lines[0][len(pad):], *lines[1:]] if lines else [line]
    return "\n".join(out)
