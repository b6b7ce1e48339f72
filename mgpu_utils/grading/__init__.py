"""Exercises of every lesson: the quiz answers a notebook checks (``quiz``), the locked predictions
(``predict``), and the graded coding exercises run under
torchrun (``runner`` in the notebook; ``coding``, one module per lesson topic, in each rank; ``catalog`` and
``common`` on both sides; ``bulk`` grades a class)."""
