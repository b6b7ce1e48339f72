"""What the lessons build from scratch: the ring all-reduce (04), pipeline schedules and their runtime,
tensor-parallel layers (05), a parameter server's staleness (08)."""
