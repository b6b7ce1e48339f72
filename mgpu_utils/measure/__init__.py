"""Measuring a run (lessons 07 and 11): memory (07), profiler traces (11), energy (11), scaling studies (11), and
the collectives a piece of code calls (the graders of lessons 03 to 12, and 05)."""
