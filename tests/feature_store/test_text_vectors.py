"""Pretrained word vectors for the title tokens, from a local file (``features.text_vectors``)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from feature_store.errors import ConfigurationError
from feature_store.features.keys import feature_key
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings

VECTORS = """3 4
car 1.0 0.0 0.0 0.5
auto 0.9 0.1 0.0 0.5
banana 0.0 0.0 1.0 -0.5
"""


def test_title_words_start_from_their_vectors(tmp_path: Path) -> None:
    path = tmp_path / "words.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(VECTORS)
    settings = Settings(data_dir=tmp_path / "data", features={"text_vectors": str(path)})
    with open_resources(settings) as resources:
        table, tower = resources.tables["title"], resources.tables["tt_title"]
        keys = np.array([feature_key("title", w) for w in ("car", "auto", "banana", "zebra")],
                        dtype=np.uint64)
        rows = table.pull(keys, train=True)
        assert rows.shape == (4, 8) and tower.pull(keys, train=True).shape == (4, 16)

        def cosine(a: np.ndarray, b: np.ndarray) -> float:
            return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

        # Near words start near each other (a random start would not), on the random
        # rows' scale.
        assert cosine(rows[0], rows[1]) > 0.9 > cosine(rows[0], rows[2])
        scale = settings.sparse.init_scale
        assert np.linalg.norm(rows[0]) == pytest.approx(scale * np.sqrt(8 / 3), rel=1e-5)
        assert np.abs(rows[3]).max() <= scale  # a word the file lacks: random, as before


def test_a_malformed_file_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "words.txt"
    path.write_text("car 1.0 2.0\nauto 1.0\n")
    settings = Settings(data_dir=tmp_path / "data", features={"text_vectors": str(path)})
    with pytest.raises(ConfigurationError, match="words.txt:2"):
        open_resources(settings).__enter__()
