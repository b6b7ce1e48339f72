"""Running launch scripts under torchrun from a notebook or a test: the launcher, warm launches, and
several torchrun agents as the nodes of one job (lessons 00-11)."""
