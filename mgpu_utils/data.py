"""The course's real dataset: scikit-learn's digits, split once, sharded per rank as DDP shards it
(lessons 02, 03, 07, 09, 10, 11 and 12).

Introduced in ``notebooks/03_ddp.ipynb`` (``launch_scripts/ddp_train.py``); also used by lessons 07
(``grad_accumulation.py``, ``zero_fsdp.py``) and 08 (``sync_async.py``, ``local_sgd.py``,
``comm_hooks.py``). No download: the 1,797 8x8 images ship inside scikit-learn's wheel.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os


def load_data(test_fraction: float = 0.2, seed: int = 0):
    """Digits as a fixed, class-stratified train/test split.

    Reads the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``, what ``load_digits``
    reads) without importing scikit-learn: that saves about 2.5 s of start-up in every rank. The file is parsed
    once per process (:func:`_digits_table`); every call makes new tensors.

    Args:
        test_fraction: share of each class held out for testing (0.2: 1,438 train, 359 test images).
        seed: seed of the split (the same split on every rank and in every run).

    Returns:
        ``(train, test)``: two ``TensorDataset`` of ``X`` (N, 1, 8, 8) float32 in [0, 1] and ``y`` (N,)
        int64 class labels 0..9.

    Raises:
        ModuleNotFoundError: scikit-learn is not installed (``pip install scikit-learn``).
    """
    import torch
    from torch.utils.data import TensorDataset

    data = _digits_table()
    X, y = data[:, :64].view(-1, 1, 8, 8) / 16.0, data[:, 64].long()
    g = torch.Generator().manual_seed(seed)
    test = torch.cat([c[torch.randperm(len(c), generator=g)][:round(test_fraction * len(c))]
                      for c in (torch.nonzero(y == k).flatten() for k in range(10))])
    is_test = torch.zeros(len(y), dtype=torch.bool)
    is_test[test] = True
    return TensorDataset(X[~is_test], y[~is_test]), TensorDataset(X[is_test], y[is_test])


@functools.lru_cache(maxsize=1)
def _digits_table():
    """The digits file as one float32 tensor (1797, 65): 64 pixels (0..16) and the label. Read once per process
    (0.06 s; a grader calls load_data in every round): load_data makes new tensors of it, this one is never
    handed out."""
    import torch

    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ModuleNotFoundError("the digits come with scikit-learn: pip install scikit-learn (or make setup)")
    pkg = spec.submodule_search_locations[0]
    with gzip.open(os.path.join(pkg, "datasets", "data", "digits.csv.gz"), "rt") as f:
        return torch.tensor([[float(v) for v in line.split(",")] for line in f])


def shard_batches(dataset, num_replicas: int, rank: int, epoch: int, batch_size: int, seed: int) -> list[list[int]]:
    """Index batches of one rank for one epoch, exactly as ``DistributedSampler`` + ``DataLoader`` give them.

    Args:
        dataset: any sized dataset (only its length is used).
        num_replicas: number of ranks sharing the data (world size, or the number of workers).
        rank: this rank's shard, 0 .. num_replicas-1.
        epoch: passed to ``set_epoch`` (a new shuffle per epoch).
        batch_size: samples per batch (the last batch may be smaller).
        seed: the sampler's shuffle seed (the same on every rank).

    Returns:
        A list of batches, each a list of sample indices into ``dataset``.
    """
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)  # without this every epoch repeats epoch 0's order
    idx = list(sampler)
    return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]


def batch_stream(dataset, num_replicas: int, rank: int, batch_size: int, seed: int):
    """Rank ``rank``'s batches (index lists), epoch after epoch without end, as :func:`shard_batches` gives them.

    Used where training counts steps, not epochs (lesson 09's workers and local SGD)."""
    epoch = 0
    while True:
        yield from shard_batches(dataset, num_replicas, rank, epoch, batch_size, seed)
        epoch += 1



class AugmentedDigits:
    """The digits as a map-style dataset whose samples cost CPU time to make, as real image pipelines do.

    Each ``dataset[i]`` resizes the 8x8 image to ``size`` x ``size`` and applies a random affine transform
    (``torchvision.transforms.v2``: rotation up to 15 degrees, shifts up to 10%, scale 0.9-1.1). A plain
    class in this module, so that ``DataLoader`` workers can unpickle it under any start method (spawn,
    forkserver: a class defined in a notebook cell cannot be).

    Args:
        size: output height and width (pixels, >= 8); train: the training split (else the test split);
        augment: the random affine transform (False: resized only, for evaluation).

    Raises:
        ValueError: size below 8.

    Items: ``(x, y)``: x float32 (1, size, size) in [0, 1], y an int64 label.
    Introduced in ``notebooks/11_benchmarking.ipynb`` (the input pipeline).
    """

    def __init__(self, size: int = 32, train: bool = True, augment: bool = True):
        if size < 8:
            raise ValueError(f"size is the output height and width in pixels, at least the digits' 8; got {size}")
        self.size, self.data, self.augment, self._transform = size, load_data()[0 if train else 1], augment, None

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        if self._transform is None:               # built on first use, in the process that uses it
            from torchvision.transforms import v2

            steps = [v2.Resize((self.size, self.size), antialias=True)]
            if self.augment:
                steps.append(v2.RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.9, 1.1)))
            self._transform = v2.Compose(steps)
        x, y = self.data[i]
        return self._transform(x), y
