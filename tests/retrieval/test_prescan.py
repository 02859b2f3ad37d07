"""The int8 first pass of a vector table (providers.prescan) and its use in providers.ranking.Vectors: full
blocks of rows are scored in int8, their best rows again exactly, the rest of the table exactly."""

import numpy as np
import pytest

from retrieval import prescan
from retrieval.ranking import Vectors


def _table(rows: int, dimension: int = 32, seed: int = 3) -> np.ndarray:
    matrix = np.random.default_rng(seed).standard_normal((rows, dimension)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(prescan, "BLOCK_ROWS", 64)
    monkeypatch.setattr(prescan, "RESCORE_ROWS", 50)
    monkeypatch.setattr(prescan, "_unavailable", [])


def _filled(matrix: np.ndarray) -> Vectors:
    vectors = Vectors()
    for position, row in enumerate(matrix):
        vectors[position] = row
    return vectors


def test_an_int8_block_scores_within_a_few_thousandths_of_the_cosine():
    matrix, query = _table(300, 384), _table(1, 384, seed=4)[0]
    block = prescan.int8_block(matrix)
    assert block is not None
    assert np.abs(block.scores(query) - matrix @ query).max() < 0.01


def test_rows_of_large_components_of_one_sign_do_not_saturate_the_int8_kernel():
    """The worst case for a kernel that sums products of pairs in 16 bits (AVX2 without VNNI): every
    component near its row's largest, and a query of one sign."""
    rng = np.random.default_rng(3)
    matrix = rng.uniform(0.9, 1.0, size=(256, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    query = matrix[0].copy()
    block = prescan.int8_block(matrix)
    assert block is not None
    assert np.abs(block.scores(query) - matrix @ query).max() < 0.01


def test_quantised_rows_come_back_with_their_scale():
    matrix = _table(20)
    quantised, scales = prescan.quantise_rows(matrix)
    assert quantised.dtype == np.int8
    assert np.abs(quantised).max(axis=1).tolist() == [prescan.QUANTISED_MAX] * 20
    assert np.abs(quantised * scales[:, None] - matrix).max() <= scales.max() / 2 + 1e-7


def test_the_best_rows_are_exact_and_ranked_as_an_exact_scan_would(small_blocks):
    matrix = _table(1000)
    vectors = _filled(matrix)
    for seed in range(5):
        query = _table(1, seed=10 + seed)[0]
        scores, exact = vectors.similarity(query, 1000), matrix @ query
        best = np.argsort(-exact)[:20]
        assert np.argsort(-scores)[:20].tolist() == best.tolist()
        assert scores[best] == pytest.approx(exact[best], abs=1e-6)
        assert np.abs(scores - exact).max() < 0.05  # the rest: int8 estimates (rows 960.. are exact)
        assert scores[960:] == pytest.approx(exact[960:], abs=1e-6)
    assert len(vectors._blocks) == 15 and all(vectors._blocks)  # the int8 pass did the scan


def test_a_row_written_again_in_a_full_block_is_scored_as_it_is_now(small_blocks):
    matrix = _table(300)
    vectors = _filled(matrix)
    query = _table(1, seed=9)[0]
    vectors.similarity(query, 300)
    vectors[5] = query  # item 5 (block 0) changes after its block was built
    scores = vectors.similarity(query, 300)
    assert int(np.argmax(scores)) == 5 and scores[5] == pytest.approx(1.0, abs=1e-6)


def test_without_onnxruntime_every_row_is_scored_exactly_and_the_failure_is_logged_once(
    small_blocks, monkeypatch, caplog
):
    def unavailable(rows):
        raise ImportError("No module named 'onnxruntime'")

    monkeypatch.setattr(prescan, "_block", unavailable)
    matrix = _table(500)
    vectors = _filled(matrix)
    for seed in range(3):
        query = _table(1, seed=20 + seed)[0]
        assert vectors.similarity(query, 500) == pytest.approx(matrix @ query, abs=1e-6)
    assert [r.message for r in caplog.records if "int8 prescan" in r.message] == [
        "int8 prescan unavailable (ImportError: No module named 'onnxruntime'); vectors are scored in float32"
    ]
