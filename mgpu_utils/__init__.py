"""mgpu_utils: the helper package of the hands-on multi-GPU parallel training course (every lesson).

Rooms by role; nothing runs at import time, and ``import mgpu_utils`` imports no torch. A lesson
imports what it uses from the module that holds it, e.g. ``from mgpu_utils.launch.launcher import launch``.

What the launch scripts share (top level):

* ``dist``       - inside a launch script: rank and world size, the backend rule, set up and tear down, results.
* ``data``, ``text_data``, ``models`` - the digits dataset, the stdlib-docstring text, the small models.
* ``checks``, ``timing``, ``compat``  - tolerances, clocks and the quiet-machine check, torch-version names.
* ``env``        - what this machine has and which tier (CPU / 1 GPU / many GPUs) the course uses (lesson 00).
* ``course``     - every notebook's setup call (:func:`course.start`), and ``make course``.
* ``colab``      - the Colab badges and the setup block of every notebook (``python -m mgpu_utils.colab``).

Subpackages:

* ``launch``   - run a launch script under torchrun from a notebook or a test; warm launches; several nodes.
* ``parallel`` - what the lessons build from scratch: ring all-reduce, pipeline schedules, tensor parallel.
* ``costs``    - cost models checked against published numbers: bandwidth, hardware, memory, planner, scaling.
* ``measure``  - measuring a run: memory, profiler traces, energy, scaling studies.
* ``figures``  - every figure and widget, one module per topic.
* ``grading``  - the quiz a notebook checks, and the graded coding exercises run under torchrun.
"""

__version__ = "0.1.0"
