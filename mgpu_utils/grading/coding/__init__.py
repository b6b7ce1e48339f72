"""The graded coding exercises of lessons 03 to 12, one module per lesson topic (named as in ``figures/``): each
holds its exercises' records (``EXERCISES``), their rank-side checks and reference computations, and the hints
of the problems its checks report (``HINTS``); :mod:`mgpu_utils.grading.catalog` gathers the records."""
