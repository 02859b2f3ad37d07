"""providers.ranking: BM25 as a share of the query's ceiling, cosine over stored vectors, ranks among the
eligible items, and reciprocal rank fusion (what memory.history_index and knowledge.search rank with)."""

import gc
import math
import weakref
from collections import Counter

import numpy as np
import pytest

from retrieval import ranking
from retrieval.ranking import K1, RRF_K, B, Postings, Vectors, best_first, best_positions, fuse, ranks, rrf


def _table(*documents: str) -> Postings:
    table = Postings()
    for document in documents:
        table.add(Counter(document.split()))
    return table


def test_bm25_is_the_textbook_score_divided_by_the_query_ceiling():
    table = _table("deploy failed", "deploy passed after retry", "lunch menu")
    average = (2 + 4 + 2) / 3  # the items' lengths in terms

    def idf(df: int) -> float:
        return math.log(1 + (3 - df + 0.5) / (df + 0.5))

    def part(df: int, length: int) -> float:
        return idf(df) * (K1 + 1) / (1 + K1 * (1 - B + B * length / average))

    ceiling = (idf(2) + idf(1)) * (K1 + 1)
    expected = [(part(2, 2) + part(1, 2)) / ceiling, part(2, 4) / ceiling, 0.0]
    assert table.bm25(["deploy", "failed", "deploy"]) == pytest.approx(expected, rel=1e-5)


def test_bm25_shares_stay_between_0_and_1_and_come_near_1_for_every_term_many_times():
    rng = np.random.default_rng(4)
    words = [f"w{i}" for i in range(40)]
    table = _table(*(" ".join(rng.choice(words, size=rng.integers(1, 30))) for _ in range(200)))
    for _ in range(50):
        scores = table.bm25(list(rng.choice(words, size=rng.integers(1, 6))))
        assert scores.min() >= 0 and scores.max() < 1
    table.add(Counter({"w1": 5000, "w2": 5000}))
    scores = table.bm25(["w1", "w2"])
    # Short of 1 only by the length term: its length grows with its term counts.
    assert 0.95 < scores[-1] < 1 and scores[:-1].max() < 0.8


def test_a_term_every_document_holds_scores_near_nothing_beside_a_rare_one():
    table = _table(*(["the release notes"] * 19), "the vault rotation key")
    scores = table.bm25(["the", "vault"])
    assert scores[:19].max() < 0.02  # holds only "the", which all 20 hold
    assert scores[19] > 0.4


def test_bm25_without_items_or_known_terms_is_all_zero():
    assert Postings().bm25(["anything"]).shape == (0,)
    assert not _table("alpha beta", "gamma").bm25(["delta"]).any()
    assert not _table("alpha beta").bm25([]).any()


def test_a_document_outside_the_table_scores_as_the_same_document_inside_it():
    table = _table("deploy failed", "deploy passed after retry", "lunch menu")
    query = ["deploy", "failed", "retry"]
    inside = table.bm25(query)
    for position, text in enumerate(["deploy failed", "deploy passed after retry", "lunch menu"]):
        assert table.share(query, Counter(text.split())) == pytest.approx(float(inside[position]), rel=1e-5)


def test_a_query_term_only_the_outside_document_holds_counts_as_the_rarest():
    table = _table("deploy failed", "lunch menu")
    with_it = table.share(["deploy", "kestrel"], Counter(["kestrel"]))
    assert 0 < with_it < 1
    # Held by nothing, on neither side: it is not part of what the query could score.
    assert table.share(["deploy", "kestrel"], Counter(["deploy", "failed"])) == pytest.approx(
        float(table.bm25(["deploy"])[0]), rel=1e-5
    )
    assert Postings().share(["deploy"], Counter(["deploy"])) == 0.0


def test_items_added_after_a_query_are_scored_as_in_a_table_built_with_them():
    grown = _table("alpha beta", "beta gamma gamma")
    grown.bm25(["beta"])  # builds the length cache
    grown.add(Counter({"alpha": 4, "delta": 1, "epsilon": 1}))
    fresh = _table("alpha beta", "beta gamma gamma", "alpha alpha alpha alpha delta epsilon")
    assert len(grown) == 3
    assert grown.bm25(["alpha", "beta"]).tolist() == fresh.bm25(["alpha", "beta"]).tolist()


def _unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_similarity_is_the_cosine_of_the_items_that_have_a_vector():
    vectors = Vectors()
    vectors[0] = _unit(1, 0)
    vectors[2] = _unit(1, 1)
    assert vectors.get(2).tolist() == _unit(1, 1).tolist() and vectors.get(1) is None
    scores = vectors.similarity(_unit(1, 0), 4)
    assert scores == pytest.approx([1.0, 0.0, math.sqrt(0.5), 0.0], abs=1e-6)
    assert not vectors.similarity(None, 4).any()
    assert not Vectors().similarity(_unit(1, 0), 4).any()
    assert not vectors.similarity(_unit(1, 0, 0), 4).any()  # another model's dimension


def test_cosines_are_each_items_exact_cosine_to_four_places_in_the_order_asked():
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(5, 8)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    vectors = Vectors()
    for item in (4, 0, 3):  # written out of order, item 1 and 2 without a vector
        vectors[item] = rows[item]
    query = rows[2]
    expected = [round(float(np.dot(rows[i], query)), 4) if i in (0, 3, 4) else 0.0 for i in (3, 1, 0, 4, 2)]
    assert vectors.cosines([3, 1, 0, 4, 2], query) == expected
    assert vectors.cosines([0, 3], None) == [0.0, 0.0]
    assert vectors.cosines([0, 3], np.ones(3, dtype=np.float32)) == [0.0, 0.0]  # another model's dimension
    assert Vectors().cosines([0], query) == [0.0]


def test_a_vector_added_after_a_query_is_scored_and_another_model_forgets_them():
    vectors = Vectors()
    vectors.use_model("minilm")
    vectors[0] = _unit(1, 0)
    vectors.similarity(_unit(0, 1), 2)  # builds the matrix
    vectors[1] = _unit(0, 1)
    assert vectors.similarity(_unit(0, 1), 2) == pytest.approx([0.0, 1.0], abs=1e-6)
    vectors.use_model("minilm")
    assert len(vectors) == 2
    vectors.use_model("other")
    assert (vectors.model, len(vectors)) == ("other", 0)


def test_a_written_vector_is_kept_once_in_the_matrix_not_with_the_buffer_it_came_in():
    """An index's vectors arrive as views of database blobs: once a search has written them to the matrix,
    the table holds neither them nor their blobs (a 100,000-message conversation's index: 266.7 MB with that
    second copy, 170.1 MB without). Their values, their count and their mean stay as they were."""
    blob = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    blob_alive = weakref.ref(blob)
    vectors = Vectors()
    vectors[0], vectors[1] = blob[0], blob[1]
    assert vectors.get(0) is not None and len(vectors) == 2
    vectors.similarity(_unit(1, 0), 2)  # writes them
    del blob
    gc.collect()
    assert blob_alive() is None
    assert vectors.get(0).tolist() == pytest.approx([0.6, 0.8]) and vectors.get(1).tolist() == [1.0, 0.0]
    assert len(vectors) == 2 and vectors.mean().tolist() == pytest.approx([0.8, 0.4])
    vectors[1] = _unit(0, 1)  # a written vector replaced: counted once, the mean follows
    assert len(vectors) == 2 and vectors.mean().tolist() == pytest.approx([0.3, 0.9])


def test_vectors_added_between_queries_score_as_in_a_table_built_with_them():
    """The matrix grows in place (rows appended, a changed vector rewritten): every query scores exactly,
    to the bit, as a table filled at once, whether the items are 0, 1, 2, ... or scattered."""
    rng = np.random.default_rng(7)
    for positions in (list(range(40)), [int(p) for p in rng.permutation(60)[:40]]):
        grown, fresh = Vectors(), Vectors()
        vectors = {p: _unit(*rng.standard_normal(16)) for p in positions}
        for start in range(0, 40, 7):
            for p in positions[start : start + 7]:
                grown[p] = vectors[p]
            query = _unit(*rng.standard_normal(16))
            grown.similarity(query, 64)  # writes the rows so far
        vectors[positions[3]] = _unit(*rng.standard_normal(16))
        grown[positions[3]] = vectors[positions[3]]
        for p in positions:
            fresh[p] = vectors[p]
        for _ in range(5):
            query = _unit(*rng.standard_normal(16))
            assert grown.similarity(query, 64).tobytes() == fresh.similarity(query, 64).tobytes()
        assert grown.similarity(query, 64)[positions[3]] == pytest.approx(
            float(vectors[positions[3]] @ query)
        )


def test_vectors_of_another_dimension_in_one_table_are_refused():
    vectors = Vectors()
    vectors[0] = _unit(1, 0)
    vectors.similarity(_unit(1, 0), 2)
    vectors[1] = _unit(1, 0, 0)
    with pytest.raises(ValueError):
        vectors.similarity(_unit(1, 0), 2)


def test_ranks_order_eligible_positive_scores_ties_by_position_to_a_depth():
    scores = np.array([0.5, 0.9, 0.5, 0.0, 0.7, -0.2, 0.9], dtype=np.float32)
    everything = np.ones(7, dtype=bool)
    assert ranks(scores, everything, 10).tolist() == [4, 1, 5, 0, 3, 0, 2]
    eligible = np.array([1, 0, 1, 1, 1, 1, 1], dtype=bool)
    assert ranks(scores, eligible, 10).tolist() == [3, 0, 4, 0, 2, 0, 1]
    assert ranks(scores, eligible, 2).tolist() == [0, 0, 0, 0, 2, 0, 1]
    assert not ranks(np.zeros(3, dtype=np.float32), np.ones(3, dtype=bool), 5).any()


def test_fusion_adds_each_ranking_weight_over_rrf_k_plus_the_rank():
    lexical = np.array([0.9, 0.5, 0.0, 0.1], dtype=np.float32)
    vector = np.array([0.0, 0.8, 0.6, 0.2], dtype=np.float32)
    eligible = np.array([1, 1, 1, 0], dtype=bool)
    fused = fuse(((1.0, lexical), (1.5, vector)), eligible, 200)
    expected = [1 / (RRF_K + 1), 1 / (RRF_K + 2) + 1.5 / (RRF_K + 1), 1.5 / (RRF_K + 2), 0.0]
    assert fused == pytest.approx(expected)
    per_item = np.array([1.0, 0.0, 2.0, 1.0])  # e.g. no vector weight for code chunks
    fused = fuse(((per_item, vector),), eligible, 200)
    assert fused == pytest.approx([0.0, 0.0, 2.0 / (RRF_K + 2), 0.0])


def test_best_first_takes_positive_scores_best_first_ties_by_position():
    fused = np.array([0.1, 0.0, 0.3, 0.1, 0.2])
    assert best_first(fused, 10).tolist() == [2, 4, 0, 3]
    assert best_first(fused, 2).tolist() == [2, 4]
    assert best_first(np.zeros(3), 5).tolist() == []


def test_rrf_of_key_lists_sums_over_the_lists_a_key_appears_in():
    assert rrf(["a", "b"], ["b"], k=10) == {"a": 1 / 11, "b": 1 / 12 + 1 / 11}
    assert rrf() == {}


def _exact_best(values: np.ndarray, count: int, where: np.ndarray) -> set[int]:
    allowed = np.flatnonzero(where)
    return set(allowed[np.argsort(-values[allowed], kind="stable")][:count].tolist())


def test_best_positions_of_a_large_array_are_those_a_full_sort_finds():
    rng = np.random.default_rng(11)
    for size, count in ((117_000, 1000), (60_000, 200), (5_000, 200), (300, 50)):
        values = rng.standard_normal(size).astype(np.float32)
        everything = np.ones(size, dtype=bool)
        assert set(best_positions(values, count).tolist()) == _exact_best(values, count, everything)
        some = rng.random(size) < 0.7
        assert set(best_positions(values, count, some).tolist()) == _exact_best(values, count, some)
    assert best_positions(values, 0).tolist() == []


def test_best_positions_when_the_allowed_values_lie_below_the_sampled_threshold():
    """The sample's threshold is read off all values: where the best ones are not allowed, fewer than
    `count` pass it and the allowed values are partitioned whole."""
    values = np.arange(100_000, dtype=np.float32)
    low = values < 50_000
    assert sorted(best_positions(values, 100, low).tolist()) == list(range(49_900, 50_000))
    assert sorted(best_positions(values, 100, values < 30).tolist()) == list(range(30))


def _postings_and_vectors(count: int) -> tuple[Postings, Vectors]:
    rng = np.random.default_rng(5)
    postings, vectors = Postings(), Vectors()
    for position in range(count):
        postings.add(Counter({"export": position % 3, f"w{position % 7}": 1}))
        vectors[position] = rng.standard_normal(8).astype(np.float32)
    return postings, vectors


def test_both_scores_on_a_large_table_shares_its_int8_blocks_with_a_helper_thread(monkeypatch):
    """Both threads take blocks until none is left; the scores are those of a scan on one thread."""
    import threading
    import time

    from retrieval import prescan

    monkeypatch.setattr(prescan, "BLOCK_ROWS", 8)
    monkeypatch.setattr(prescan, "RESCORE_ROWS", 4)
    monkeypatch.setattr(prescan, "_unavailable", [])
    postings, vectors = _postings_and_vectors(70)  # 8 full blocks and 6 rows after them
    query = np.ones(8, dtype=np.float32)
    expected = (postings.bm25(["export", "w3"]), vectors.similarity(query, 70))
    scanned_on = []
    scores = prescan.Int8Block.scores

    def recorded(block, vector):
        scanned_on.append(threading.current_thread().name)
        time.sleep(0.01)  # long enough for the helper to start before this thread has taken every block
        return scores(block, vector)

    monkeypatch.setattr(prescan.Int8Block, "scores", recorded)
    monkeypatch.setattr(ranking, "OVERLAP_VECTORS", 10)
    lexical, cosines = ranking.both_scores(postings, vectors, ["export", "w3"], query, 70)
    assert lexical.tolist() == expected[0].tolist() and cosines.tolist() == expected[1].tolist()
    assert len(scanned_on) == 8
    assert {name.startswith("mnemo-vector-scan") for name in scanned_on} == {True, False}

    scanned_on.clear()
    monkeypatch.setattr(ranking, "OVERLAP_VECTORS", 100)  # a small table: every block scanned here
    ranking.both_scores(postings, vectors, ["export"], query, 70)
    assert set(scanned_on) == {threading.current_thread().name}


def test_a_scan_does_not_wait_for_a_busy_helper(monkeypatch):
    """Under load every helper thread may be taken: the calling thread then scans every block itself and
    returns, the queued share withdrawn, instead of waiting for a thread to come free."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from retrieval import prescan

    monkeypatch.setattr(prescan, "BLOCK_ROWS", 8)
    monkeypatch.setattr(prescan, "RESCORE_ROWS", 4)
    monkeypatch.setattr(prescan, "_unavailable", [])
    _, vectors = _postings_and_vectors(40)
    query = np.ones(8, dtype=np.float32)
    expected = vectors.similarity(query, 40)
    busy, release = ThreadPoolExecutor(max_workers=1), threading.Event()
    try:
        taken = busy.submit(release.wait, 10)
        scores = vectors.similarity(query, 40, helper=busy)
        assert not taken.done()  # returned while the only helper thread was still taken
        assert scores.tolist() == expected.tolist()
    finally:
        release.set()
        busy.shutdown()


def test_both_scores_asks_for_a_pending_query_vector_after_the_bm25_pass(monkeypatch):
    """A question still being embedded elsewhere is waited for only once BM25 has scored the items."""
    postings, vectors = _postings_and_vectors(20)
    order = []
    bm25 = postings.bm25
    monkeypatch.setattr(postings, "bm25", lambda terms: order.append("bm25") or bm25(terms))

    def vector():
        order.append("vector")
        return np.ones(8, dtype=np.float32)

    _, cosines = ranking.both_scores(postings, vectors, ["export"], vector, 20)
    assert order == ["bm25", "vector"]
    assert cosines.tolist() == vectors.similarity(np.ones(8, dtype=np.float32), 20).tolist()


def test_both_scores_raises_what_the_scan_raises(monkeypatch):
    postings, vectors = _postings_and_vectors(20)

    def broken(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(vectors, "similarity", broken)
    monkeypatch.setattr(ranking, "OVERLAP_VECTORS", 10)
    with pytest.raises(MemoryError):
        ranking.both_scores(postings, vectors, ["export"], np.ones(8, dtype=np.float32), 20)


def test_the_mean_of_the_vectors_follows_additions_and_replacements():
    vectors = Vectors()
    assert vectors.mean() is None
    vectors[0] = _unit(1, 0)
    vectors[3] = _unit(0, 1)
    assert vectors.mean() == pytest.approx([0.5, 0.5])
    vectors[3] = _unit(1, 0)  # a vector written again replaces its share of the mean
    assert vectors.mean() == pytest.approx([1.0, 0.0])
    vectors.use_model("other")
    assert vectors.mean() is None


def test_a_shift_is_added_to_the_items_that_have_a_vector_only():
    vectors = Vectors()
    vectors[0] = _unit(1, 0)
    vectors[2] = _unit(-1, 0)
    scores = vectors.similarity(np.array([0.5, 0.0], dtype=np.float32), 4, shift=2.0)
    assert scores == pytest.approx([2.5, 0.0, 1.5, 0.0])
