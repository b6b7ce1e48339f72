"""What the lessons build from scratch: the ring all-reduce (04), pipeline schedules and their runtime,
tensor-parallel layers and the vocabulary split (``vocab_parallel``) (05), ring attention and Ulysses (``context``)
and a mixture-of-experts layer with expert parallelism (``experts``) (08), a parameter server's staleness and
top-k sparsification (``sparsify``) (09); the capstone's layouts of one Llama, built from them (``layouts``,
``capstone_train.py``)."""
