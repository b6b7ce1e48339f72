"""mgpu_utils.grading.predict: locked predictions (every lesson's ``predict`` cells), in-process.

How the number is asked (headless, stored, input, widget), that it stays locked, and that bad input gets a
message that says what to type.
"""
import builtins
import sys
import types

import pytest

from mgpu_utils.grading import predict
from mgpu_utils.grading.predict import ask, how_to_ask, parse, reveal


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """An empty record and no MGPU_PREDICT, as a new kernel starts."""
    monkeypatch.setattr(predict, "RECORDED", {})
    monkeypatch.delenv(predict.ENV, raising=False)


def fake_kernel(monkeypatch, allow_stdin: bool):
    """Make how_to_ask() see an IPython kernel whose current request has this allow_stdin."""
    kernel = types.SimpleNamespace(get_parent=lambda channel=None: {"content": {"allow_stdin": allow_stdin}})
    monkeypatch.setattr(predict, "_ipython", lambda: types.SimpleNamespace(kernel=kernel))
    import IPython  # noqa: F401  (how_to_ask looks for a kernel only once IPython is imported)


def test_headless_process_uses_the_stored_guess_and_still_compares(capsys):
    # pytest's stdin is not a terminal: nobody can answer
    assert how_to_ask() == "stored"
    ask("t.speedup", "Speed-up of 4 ranks over 1?", unit="x", stored=3.0)
    assert predict.RECORDED["t.speedup"].value == 3.0
    reveal("t.speedup", 1.5, why="4 ranks share 2 cores")
    out = capsys.readouterr().out
    assert "the stored guess: 3x" in out and "measured: 1.5x" in out
    assert "measured / predicted = 0.50" in out and "why: 4 ranks share 2 cores" in out
    assert max(map(len, out.splitlines())) <= 100


def test_a_kernel_without_stdin_is_headless_and_a_front_end_gets_a_widget(monkeypatch):
    fake_kernel(monkeypatch, allow_stdin=False)          # nbclient (make course), nbval
    assert how_to_ask() == "stored"
    fake_kernel(monkeypatch, allow_stdin=True)           # JupyterLab, VS Code
    assert how_to_ask() == "widget"
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert how_to_ask() == "input"                       # Colab: a plain input()


def test_the_environment_variable_decides_and_a_wrong_value_is_named(monkeypatch):
    monkeypatch.setenv(predict.ENV, "input")
    assert how_to_ask() == "input"
    monkeypatch.setenv(predict.ENV, "yes")
    with pytest.raises(ValueError, match=r"MGPU_PREDICT='yes': use one of stored, input, widget"):
        how_to_ask()


def test_a_prediction_is_locked_once_given(monkeypatch, capsys):
    answers = iter(["2.5"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(answers))
    ask("t.bytes", "Bytes of one all-reduce?", unit="bytes", stored=100, mode="input")
    assert (predict.RECORDED["t.bytes"].value, predict.RECORDED["t.bytes"].source) == (2.5, "yours")
    monkeypatch.setattr(builtins, "input", lambda prompt="": pytest.fail("asked twice"))
    ask("t.bytes", "Bytes of one all-reduce?", unit="bytes", stored=100, mode="input")
    assert predict.RECORDED["t.bytes"].value == 2.5
    reveal("t.bytes", 5)
    out = capsys.readouterr().out
    assert "locked: your prediction, 2.5 bytes" in out and "your prediction: 2.5 bytes" in out
    assert "measured / predicted = 2.00" in out


def test_bad_input_says_what_to_type_and_asks_again(monkeypatch, capsys):
    answers = iter(["fast", "", "ignored"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(answers))
    ask("t.x", "Ratio?", unit="x", stored=4, mode="input")
    out = capsys.readouterr().out
    assert "'fast' is not a number: type digits only, e.g. 2.5 (in x)" in out
    # an empty answer keeps the stored guess, and says so
    assert predict.RECORDED["t.x"].value == 4 and "locked: the stored guess, 4x" in out


@pytest.mark.parametrize("text, value", [("2.5", 2.5), (" 3x ", 3.0), ("1,200", 1200.0), ("40 %", 40.0),
                                         ("1e9", 1e9)])
def test_parse_reads_what_students_type(text, value):
    assert parse(text, unit="%" if "%" in text else "x") == value


@pytest.mark.parametrize("text", ["", "two", "nan", "inf", "3 4"])
def test_parse_refuses_what_is_not_a_number(text):
    with pytest.raises(ValueError, match="is not a number: type digits only"):
        parse(text)


def test_misuse_gets_a_clear_error():
    with pytest.raises(KeyError, match=r"no prediction 't.none' in this kernel: run its predict cell"):
        reveal("t.none", 1.0)
    with pytest.raises(ValueError, match="the stored guess of 't.a' must be a number, got 'three'"):
        ask("t.a", "?", stored="three")
    with pytest.raises(ValueError, match="mode='gui': use one of stored, input, widget"):
        ask("t.a", "?", stored=3, mode="gui")
    ask("t.a", "?", stored=3)
    with pytest.raises(ValueError, match="the measured value of 't.a' must be a finite number"):
        reveal("t.a", float("nan"))


def test_zero_prediction_has_no_ratio(capsys):
    ask("t.z", "Bubble?", stored=0)
    reveal("t.z", 0.25)
    assert "undefined (the prediction is 0)" in capsys.readouterr().out


def test_widget_locks_on_a_number_refuses_a_word_and_closes_at_the_reveal(capsys):
    pytest.importorskip("ipywidgets")
    ask("t.w", "Speed-up?", unit="x", stored=3, mode="widget")
    pred = predict.RECORDED["t.w"]
    box, button, note = pred.widget.children
    box.value = "lots"
    button.click()
    assert not pred.locked and "'lots' is not a number" in note.value
    box.value = "1.8"
    button.click()
    assert (pred.value, pred.source) == (1.8, "yours") and box.disabled and button.disabled
    reveal("t.w", 0.9)
    assert pred.widget is None and "your prediction: 1.8x" in capsys.readouterr().out


def test_an_unlocked_widget_at_the_reveal_uses_the_stored_guess_and_says_so(capsys):
    pytest.importorskip("ipywidgets")
    ask("t.r", "Speed-up?", unit="x", stored=3, mode="widget")   # Run All: nobody pressed Lock
    reveal("t.r", 1.2)
    out = capsys.readouterr().out
    assert "the stored guess: 3x (nothing was locked before the run" in out
    assert predict.RECORDED["t.r"].locked and predict.RECORDED["t.r"].widget is None
