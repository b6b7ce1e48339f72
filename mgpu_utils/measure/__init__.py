"""Measuring a run (lessons 07 and 10): memory (07), profiler traces (10), energy (10), scaling studies (10), and
the collectives a piece of code calls (the graders of lessons 03 to 12, and 05)."""
