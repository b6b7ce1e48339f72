"""Measuring a run (lessons 07 and 10): memory (07), profiler traces (10), energy (10), scaling studies (10)."""
