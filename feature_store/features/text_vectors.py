"""Pretrained word vectors for the title tokens, read from a local file.

``features.text_vectors`` may name a text file of word vectors in the usual
GloVe / word2vec text format (one ``word v1 v2 ... vD`` per line; a first
line ``count D`` is skipped; ``.gz`` read as gzip). Nothing is downloaded.
The embedding rows of the tables that hold title tokens (the ranker's and
the video tower's) then *start* from those vectors instead of at random, the
first time the trainer admits the word: a word seen in one video's title
already sits near its synonyms for the next video.

A file's vectors are wider than a sparse row, so each is projected by a
fixed Gaussian matrix (seeded by the table's name: every process that reads
the same file starts the same rows, as :mod:`feature_store.sparse.initializers`
requires) and rescaled to the norm of a random row (``sparse.init_scale``),
so pretrained and random rows start on one scale. Only single words get a
vector (a pair ``star_wars`` starts at random).
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from feature_store.errors import ConfigurationError
from feature_store.features.keys import KeyHasher
from feature_store.sparse.initializers import table_seed

Rows = npt.NDArray[np.float32]

MAX_WORDS = 500_000
"""Vectors read at most (a large file's first words: files list frequent words first)."""


def read_vectors(path: Path, max_words: int = MAX_WORDS) -> tuple[list[str], Rows]:
    """The words of ``path`` and their vectors ``(n, D)``; a clear error naming the file
    and line for a malformed one."""
    words: list[str] = []
    vectors: list[list[float]] = []
    width = 0
    with _open(path) as lines:
        for number, line in enumerate(lines, start=1):
            parts = line.rstrip("\n").split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec's header: count and width
            try:
                values = [float(v) for v in parts[1:] if v]
            except ValueError as exc:
                raise ConfigurationError(f"features.text_vectors: {path}:{number}: {exc}") from exc
            if not width:
                width = len(values)
            if not width or len(values) != width:
                raise ConfigurationError(
                    f"features.text_vectors: {path}:{number}: {len(values)} numbers, "
                    f"expected {width or 'at least one'}"
                )
            words.append(parts[0].lower())
            vectors.append(values)
            if len(words) >= max_words:
                break
    if not words:
        raise ConfigurationError(f"features.text_vectors: {path} holds no vectors")
    return words, np.asarray(vectors, dtype=np.float32)


def presets(
    words: list[str], vectors: Rows, key_space: str, table: str, dim: int, scale: float
) -> dict[int, Rows]:
    """Initial rows of ``table`` (``dim`` wide) by the key of each word in ``key_space``."""
    rng = np.random.default_rng(table_seed(table))
    projection = rng.standard_normal((vectors.shape[1], dim)).astype(np.float32)
    rows = vectors @ projection
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    target = scale * math.sqrt(dim / 3.0)  # a uniform(-scale, scale) row's expected norm
    rows = (rows * (target / np.maximum(norms, 1e-12))).astype(np.float32)
    keys = KeyHasher(key_space).hash_many(words)
    return {int(k): row for k, row in zip(keys.tolist(), rows, strict=True)}


def _open(path: Path) -> IO[str]:
    if not path.is_file():
        raise ConfigurationError(f"features.text_vectors: no file at {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")
