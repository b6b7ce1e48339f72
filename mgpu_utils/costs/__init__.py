"""Cost models checked against published numbers (lessons 01 and 03-12): bandwidth and the alpha-beta model (04), DDP's
buckets overlapping backward, simulated (03, exercise 03.9), GPU and link specifications and SM occupancy (01), the
interconnect emulator (08), memory per GPU (07), the 3-D planner (06), scaling laws (10), snapshot intervals (11)."""
