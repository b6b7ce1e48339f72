"""mgpu_utils: the helper package of the hands-on multi-GPU parallel training course (every lesson).

Rooms by role; nothing runs at import time, and ``import mgpu_utils`` imports no torch. A lesson
imports each name from the module that defines it, e.g. ``from mgpu_utils.launch.launcher import launch``.

At the top, what launch scripts and notebooks share:

* ``dist``       - inside a launch script: rank and world size, the backend rule, set up and tear down, results.
* ``data``, ``text_data``, ``models`` - the digits dataset, the stdlib-docstring text, the small models
  (the capstone's Llama-style ``TinyLlama`` among them).
* ``checks``, ``timing``, ``compat``  - tolerances, clocks and the quiet-machine check, torch-version names.
* ``text``       - long lines broken at spaces (``wrap_text``), for every message the course prints.
* ``env``        - what this machine has, which tier (CPU / 1 GPU / many GPUs) the course uses, where it is.
* ``course``     - every lesson's setup call (``start``), and ``make course``.
* ``colab``      - the Colab badges and the setup cell of every lesson (``python -m mgpu_utils.colab``).
* ``source``     - the course's code read in a lesson: ``show_code`` before a launch, ``load_script``.

Subpackages (where a new function goes):

* ``launch``   - running a launch script from a notebook or a test: ``launcher`` (the API), ``warm`` and
  ``warm_template`` (warm launches), ``nodes`` (several agents as one job), ``logs`` (a failure's root cause
  and its hint), ``processes`` (the ranks' environment, stopping process trees); ``cluster`` (a shared folder,
  a clean stop before a time limit) and ``slurm`` (a real one-host Slurm cluster) (12).
* ``parallel`` - what the lessons build from scratch: ``ring`` (04), ``schedules`` and ``pipeline``,
  ``tensor_parallel`` and ``vocab_parallel`` (05), ``context`` (ring attention, Ulysses) and ``experts``
  (mixture of experts, expert parallelism) (08), ``staleness`` and ``sparsify`` (09); ``layouts`` (the capstone's
  layouts of one Llama on a DeviceMesh, from those pieces: ``capstone_train.py``).
* ``costs``    - formulas checked against published numbers: ``bandwidth`` (04), ``hardware`` and
  ``occupancy`` (01), ``overlap`` (03: DDP's buckets against the backward), ``interconnect`` (09),
  ``memory_model`` (07), ``planner`` (06), ``scaling`` (11), ``fault`` (12).
* ``measure``  - measuring a run: ``memory`` (07), ``profiling``, ``energy``, ``scaling_study`` (11);
  ``comm_calls`` (collectives counted or switched off: the graders, and 05's vocabulary parallelism).
* ``figures``  - every figure and widget, one module per lesson topic: ``data_parallel`` (00, 02, 03),
  ``collectives`` (04), ``model_parallel`` (05), ``hybrid`` (06), ``memory`` (07), ``context_experts`` (08),
  ``sync_async`` (09), ``case_studies`` (10), ``benchmarking`` (11), ``fault_tolerance`` (12), ``capstone`` (13);
  ``common`` (colours, loss curves) and ``widget_view`` (widgets that still show something where they cannot run).
* ``grading``  - ``quiz`` (each lesson's checked answers), ``predict`` (locked predictions: a number asked
  before a run, shown against its result), ``runner`` (graded coding exercises, from the
  notebook), ``coding`` (one module per lesson topic, named as in ``figures``: each exercise's record, its
  checks inside each rank and their hints), ``catalog`` (every coding exercise by id), ``common`` (what the
  checks share), ``bulk`` (a whole class at once) and ``class_copy`` (the students' copy, no worked answer in it).
"""

__version__ = "0.1.0"
