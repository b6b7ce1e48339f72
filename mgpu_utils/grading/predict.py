"""Locked predictions (every lesson, 00-12): the student commits to a number before a run, then sees it
against the result, the ratio and the reason for the gap.

In a lesson, two cells tagged ``predict``::

    ask("02.speedup", "Speed-up of 4 ranks over 1 on this machine?", unit="x", stored=3.0)
    ...                                     # the cells whose run answers it
    reveal("02.speedup", speedup, why=f"4 ranks share {cores} cores: ...")

A prediction is **locked** once given: asked again, the cell shows the recorded number (until the kernel
restarts). How :func:`ask` gets the number (:func:`how_to_ask`):

* ``widget``: a text box and a *Lock* button (ipywidgets), in a live Jupyter kernel whose front end can
  answer (JupyterLab, VS Code). The cell returns at once; the number counts once *Lock* is pressed. If the
  measurement runs first (Run All, as the browser test does), :func:`reveal` uses the stored guess, says
  so, and closes the box.
* ``input``: a plain ``input()`` prompt, on Colab (whose widget support varies) and in a terminal. An
  empty answer keeps the stored guess; a word that is not a number asks again, saying why.
* ``stored``: the cell's ``stored`` number, a plausible guess written in the lesson (never the answer), when
  nobody can answer: ``make course`` (nbclient), nbval, the tests and CI, which execute notebooks with
  ``allow_stdin`` false in the Jupyter protocol's ``execute_request`` (that flag, sent with every cell, is
  what a kernel knows about its front end), and a Python process whose stdin is not a terminal (pytest,
  a pipe). The comparison is printed all the same, so a stored notebook shows it.

The environment variable ``MGPU_PREDICT`` (``stored``, ``input`` or ``widget``) overrides the choice.

No import-time work; ipywidgets is imported only when a widget is shown.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

from mgpu_utils.text import wrap_text

MODES = ("stored", "input", "widget")
#: the environment variable that forces a mode (one of :data:`MODES`)
ENV = "MGPU_PREDICT"


@dataclass
class Prediction:
    """One prediction: ``value`` (a float, in ``unit``), where it came from (``"yours"`` or ``"stored"``),
    and whether it is locked (given, or taken from the stored guess)."""

    key: str
    question: str
    unit: str
    stored: float
    value: float | None = None
    source: str = "stored"
    widget: object = None          # the widgets.Box while a widget waits for its Lock

    @property
    def locked(self) -> bool:
        return self.value is not None


#: every prediction asked in this kernel, by key
RECORDED: dict[str, Prediction] = {}


def fmt(value: float, unit: str = "") -> str:
    """A number as the comparison prints it: 3 significant digits, or whole with thousands separated
    from 100 to a million (``153,128``), then the unit."""
    a = abs(value)
    text = f"{value:,.0f}" if 100 <= a < 1e6 else f"{value:.3g}"
    if not unit:
        return text
    return text + (unit if unit in ("x", "%") else " " + unit)


def parse(text: str, unit: str = "") -> float:
    """The number a student typed: ``"2.5"``, ``"1,200"``, ``"3x"``, ``" 40 % "`` (the unit may follow).

    Raises:
        ValueError: not a finite number; the message says what to type.
    """
    s = str(text).strip()
    if unit and s.lower().endswith(unit.lower()):
        s = s[: -len(unit)].strip()
    try:
        value = float(s.replace(",", "").replace("_", ""))
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        example = f"e.g. 2.5 (in {unit})" if unit else "e.g. 2.5"
        raise ValueError(f"{text!r} is not a number: type digits only, {example}") from None
    return value


def _number(value, what: str) -> float:
    """``value`` as a finite float, or a ValueError that names ``what`` (a stored guess, a measured value)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return x


def how_to_ask() -> str:
    """``"widget"``, ``"input"`` or ``"stored"``: how :func:`ask` gets the number here (module docstring).

    Raises:
        ValueError: ``MGPU_PREDICT`` is set to something other than :data:`MODES`.
    """
    forced = os.environ.get(ENV, "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"{ENV}={os.environ[ENV]!r}: use one of {', '.join(MODES)} (or unset it)")
        return forced
    shell = _ipython() if "IPython" in sys.modules else None   # not imported: not inside IPython
    kernel = getattr(shell, "kernel", None)
    if kernel is None:                                   # plain Python or a terminal IPython
        stdin = sys.stdin
        return "input" if stdin is not None and stdin.isatty() else "stored"
    try:
        allow_stdin = bool(kernel.get_parent("shell").get("content", {}).get("allow_stdin", False))
    except Exception:          # an older ipykernel without get_parent: nobody to ask is the safe guess
        allow_stdin = False
    if not allow_stdin:                                  # nbclient, nbval, papermill: nobody is there
        return "stored"
    if "google.colab" in sys.modules:
        return "input"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "input"
    return "widget"


def _ipython():
    from IPython import get_ipython

    return get_ipython()


def ask(key: str, question: str, unit: str = "", stored: float = 0.0, mode: str | None = None) -> None:
    """Ask for a prediction before the run that answers it, and lock it (every lesson's ``predict`` cells).

    Args:
        key: a name unique in the lesson, e.g. ``"02.speedup"``; :func:`reveal` uses the same.
        question: one line: what to predict, with the conditions (ranks, sizes).
        unit: what the number counts (``"x"``, ``"%"``, ``"bytes"``, ``"ms"``); printed after it.
        stored: the guess used where nobody can answer (a plausible student guess, not the answer).
        mode: ``"widget"``, ``"input"`` or ``"stored"``; None: :func:`how_to_ask` decides.

    Prints the question and the locked number (or shows the widget). Asked again, it shows the locked
    number and asks nothing.

    Raises:
        ValueError: ``stored`` is not a finite number, or ``mode`` is not one of :data:`MODES`.
    """
    stored = _number(stored, f"the stored guess of {key!r}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)} (or None: decided here)")
    old = RECORDED.get(key)
    if old is not None and old.locked:
        who = "your prediction" if old.source == "yours" else "the stored guess"
        print(wrap_text(f"[{key}] {question}\n  locked: {who}, {fmt(old.value, unit)} (asked once per kernel)"))
        return
    if old is not None and old.widget is not None:
        old.widget.close()
    pred = RECORDED[key] = Prediction(key, question, unit, stored)
    mode = mode or how_to_ask()
    if mode == "stored":
        pred.value = stored
        print(wrap_text(f"[{key}] {question}\n  the stored guess: {fmt(stored, unit)} (a run nobody can "
                        "answer; in JupyterLab or Colab you type your own)"))
    elif mode == "input":
        _ask_input(pred)
    else:
        _ask_widget(pred)


def _ask_input(pred: Prediction) -> None:
    print(f"[{pred.key}] {pred.question}")
    while not pred.locked:
        try:
            text = input(f"your prediction ({pred.unit or 'a number'}; Enter keeps {fmt(pred.stored)}): ")
        except EOFError:
            text = ""
        if not text.strip():
            pred.value, pred.source = pred.stored, "stored"
        else:
            try:
                pred.value, pred.source = parse(text, pred.unit), "yours"
            except ValueError as e:
                print(f"  {e}")
    who = "your prediction" if pred.source == "yours" else "the stored guess"
    print(f"  locked: {who}, {fmt(pred.value, pred.unit)}")


def _ask_widget(pred: Prediction) -> None:
    import ipywidgets as w
    from IPython.display import display

    box = w.Text(placeholder=f"a number ({pred.unit})" if pred.unit else "a number",
                 layout=w.Layout(width="14em"))
    button = w.Button(description="Lock", button_style="primary", layout=w.Layout(width="6em"))
    note = w.Label(value="type a number, then Lock; the next cells answer it")

    def lock(_=None):
        try:
            value = parse(box.value, pred.unit)
        except ValueError as e:
            note.value = str(e)
            return
        pred.value, pred.source = value, "yours"
        box.disabled = button.disabled = True
        note.value = f"locked: {fmt(value, pred.unit)}. Now run the cells below."

    button.on_click(lock)
    pred.widget = w.HBox([box, button, note])
    print(f"[{pred.key}] {pred.question}")
    display(pred.widget)


def reveal(key: str, measured, why: str = "") -> None:
    """Print the prediction against the measured value, their ratio and the reason for the gap.

    Args:
        key: the key given to :func:`ask`.
        measured: the number the lesson computed (in the unit of the question).
        why: one sentence: why the measured value is what it is (computed in the lesson, numbers included).

    The prediction stays locked (``RECORDED[key]``), with the stored guess if nothing was locked before.

    Raises:
        KeyError: nothing was asked under ``key`` (run its ``predict`` cell first).
        ValueError: ``measured`` is not a finite number.
    """
    measured = _number(measured, f"the measured value of {key!r}")
    pred = RECORDED.get(key)
    if pred is None:
        raise KeyError(f"no prediction {key!r} in this kernel: run its predict cell (ask({key!r}, ...)) "
                       "above first")
    late = ""
    if not pred.locked:         # a widget left unlocked (Run All): the stored guess stands in, and stays
        pred.value, pred.source = pred.stored, "stored"
        late = " (nothing was locked before the run, so the stored guess stands in)"
    if pred.widget is not None:
        pred.widget.close()
        pred.widget = None
    who = "your prediction" if pred.source == "yours" else "the stored guess"
    ratio = (f"measured / predicted = {measured / pred.value:.2f}" if pred.value
             else "measured / predicted: undefined (the prediction is 0)")
    lines = [f"[{key}] {pred.question}",
             f"  {who}: {fmt(pred.value, pred.unit)}{late}",
             f"  measured: {fmt(measured, pred.unit)};  {ratio}"]
    if why:
        lines.append(f"  why: {why}")
    print(wrap_text("\n".join(lines), indent="    "))
