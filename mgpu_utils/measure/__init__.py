"""Measuring a run: memory (07), profiler traces (10), energy (10), scaling studies (10)."""
