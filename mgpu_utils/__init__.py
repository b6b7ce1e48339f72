"""mgpu_utils: the helper package of the hands-on multi-GPU parallel training course.

Small modules by concern, nothing runs at import time:

* :mod:`mgpu_utils.dist`      - inside launch scripts: rank/world size, backend choice, setup/teardown, results.
* :mod:`mgpu_utils.launcher`  - from notebooks: run a launch script under torchrun, get rank 0's result.
* :mod:`mgpu_utils.warm`      - the launcher's default on Linux: ranks forked from a template that has imported torch
  (:mod:`mgpu_utils.warm_template` is that template process).
* :mod:`mgpu_utils.env`       - what this machine has and which tier (CPU / 1 GPU / many GPUs) the course uses.
* :mod:`mgpu_utils.exercises` - check exercise answers (hint or confirmation), solutions for instructors.
* :mod:`mgpu_utils.plots`     - the course's figures.
* :mod:`mgpu_utils.course`    - run every notebook headless (``make course``).
* :mod:`mgpu_utils.data`      - the digits dataset, split and sharded per rank (lessons 03, 07, 08).
* :mod:`mgpu_utils.models`    - the small CNN and MLPs the launch scripts train (lessons 03, 07, 08).

By lesson: 01 ``hardware``, ``timing``; 04 ``bandwidth``, ``ring``; 05 ``schedules``, ``pipeline``,
``tensor_parallel``; 06 ``planner``, ``text_data``, ``hybrid_plots``; 07 ``memory``, ``memory_calc``,
``memory_model`` (also used by 06's planner); 08 ``interconnect``, ``staleness``, ``sync_plots``.
"""

__version__ = "0.1.0"
