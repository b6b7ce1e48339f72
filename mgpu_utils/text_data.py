"""A real text that is always there: the docstrings of Python's standard library, as bytes (lessons
06, 09 and 10).

Introduced in ``notebooks/06_hybrid_parallel.ipynb`` (byte-level GPT-2 trained with 2-D parallelism).
No download: the docstrings are read from the standard library's own ``.py`` files with ``ast``
(nothing is imported), in a fixed order, so the corpus is the same on every run with the same
Python version (the notebook prints its size and a SHA-256 to show it).

Byte-level: every byte is a token (vocabulary 256), so there is no tokenizer to download.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import sysconfig
from pathlib import Path

#: Standard-library source files (relative to the stdlib folder) whose docstrings form the corpus.
#: Pure-Python modules with many, well-written docstrings; present in CPython 3.11 to 3.14.
DEFAULT_FILES: tuple[str, ...] = ("argparse.py", "textwrap.py", "functools.py", "collections/__init__.py",
                                  "json/__init__.py", "json/decoder.py", "json/encoder.py", "heapq.py",
                                  "bisect.py", "fractions.py", "statistics.py", "random.py", "shutil.py",
                                  "pathlib.py", "difflib.py", "calendar.py", "string.py", "dataclasses.py")


def available_files(files: tuple[str, ...] = DEFAULT_FILES) -> list[str]:
    """The names in ``files`` that exist in this Python's standard library (e.g. ``pathlib.py`` became a
    package in 3.13)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [name for name in files if (root / name).is_file()]


def stdlib_docstrings(files: tuple[str, ...] = DEFAULT_FILES) -> str:
    """The docstrings of ``files`` (module, classes, functions, in source order), cleaned and joined.

    Files missing in this Python version are skipped (the notebook prints the corpus size).

    Returns:
        One ``str``; docstrings are separated by a blank line.

    Raises:
        FileNotFoundError: none of ``files`` exists (not a standard CPython installation).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    found = available_files(files)
    docs = []
    for name in found:
        for node in ast.walk(ast.parse((root / name).read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and len(doc.strip()) > 20:
                    docs.append(inspect.cleandoc(doc))
    if not found:
        raise FileNotFoundError(f"none of the standard-library files {files} exist under {root}")
    return "\n\n".join(docs) + "\n"


def byte_corpus(files: tuple[str, ...] = DEFAULT_FILES):
    """The corpus as a 1-D ``torch.uint8`` tensor of UTF-8 bytes (token ids 0..255)."""
    import torch

    return torch.frombuffer(bytearray(stdlib_docstrings(files).encode("utf-8")), dtype=torch.uint8)


def corpus_sha256(data) -> str:
    """SHA-256 (hex) of a uint8 tensor's bytes: identical runs read identical text."""
    return hashlib.sha256(bytes(data.tolist())).hexdigest()


def split(data, val_fraction: float = 0.1):
    """``(train, val)``: the first ``1 - val_fraction`` of the bytes and the rest (no shuffling)."""
    n_val = int(len(data) * val_fraction)
    return data[: len(data) - n_val], data[len(data) - n_val:]


def get_batch(data, step: int, batch_size: int, seq_len: int, seed: int = 0):
    """Batch ``step`` of a fixed stream: ``batch_size`` random windows of ``seq_len + 1`` bytes.

    Deterministic in ``(seed, step)`` alone, so every process (and the single-process reference)
    draws exactly the same global batch; a data-parallel rank then takes its rows.

    Returns:
        ``int64`` tensor of shape ``(batch_size, seq_len + 1)``: inputs ``[:, :-1]``, next-byte
        targets ``[:, 1:]`` (GPT2LMHeadModel shifts ``labels`` itself: pass the whole window).

    Raises:
        ValueError: the data is shorter than one window.
    """
    import torch

    if len(data) <= seq_len + 1:
        raise ValueError(f"data has {len(data)} bytes, fewer than one window of seq_len + 1 = {seq_len + 1}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
    return torch.stack([data[s: s + seq_len + 1] for s in starts.tolist()]).long()
