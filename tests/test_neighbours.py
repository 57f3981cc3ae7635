"""VocADT's neighbour search: the bfloat16 shortlist settled in float32 finds the exact float32 search's neighbours,
with excluded ids, partial key blocks, rounding too close to call and fewer keys than k."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vocgraft.train.neighbours as nb
from vocgraft.train.neighbours import CosineIndex, exact_nearest_rows, nearest_rows


@pytest.fixture(autouse=True)
def bfloat16_shortlist(monkeypatch):
    """The shortlist path on every CPU: where bfloat16 is emulated it is slower, not different (tiny cases here)."""
    monkeypatch.setattr(nb, "fast_dtype", lambda device: torch.bfloat16)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks small enough that a test case spans several of each: shortlist blocks of 128 keys (groups of 32),
    a last partial block that is no multiple of 32 (groups of one), exact blocks of 100 keys, queries in 64s."""
    monkeypatch.setattr(nb, "QUERY_BLOCK", 64)
    monkeypatch.setattr(nb, "SHORTLIST_BLOCK", 128)
    monkeypatch.setattr(nb, "KEY_BLOCK", 100)


def brute_force(queries: torch.Tensor, keys: torch.Tensor, k: int, exclude: torch.Tensor) -> list[list[int]]:
    """Each query's k most cosine-similar allowed keys, from one float32 similarity matrix."""
    sims = F.normalize(queries.float(), dim=1) @ F.normalize(keys.float(), dim=1).T
    sims[torch.arange(len(queries))[:, None].expand_as(exclude), exclude] = -torch.inf
    return sims.topk(k, dim=1).indices.tolist()


def sets(rows: torch.Tensor | list) -> list[set[int]]:
    return [set(row) for row in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]


def test_shortlist_finds_the_exact_neighbours_with_excluded_ids(small_blocks):
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(700, 24, generator=g).to(torch.bfloat16)  # a bfloat16 checkpoint's rows
    queries = torch.cat([keys[:100].float(), torch.randn(100, 24, generator=g)])  # one-hot-like and mixed rows
    exclude = torch.randint(0, 700, (200, 3), generator=g)
    exclude[:100, 0] = torch.arange(100)  # a one-hot row's own old id is its support
    index = CosineIndex(keys)
    got = index.search(queries, 24, exclude=exclude)  # k > MARGIN: ranks above the recomputed ones kept as found
    assert sets(got) == sets(brute_force(queries, keys, 24, exclude))
    assert sets(got) == sets(exact_nearest_rows(queries, keys, 24, exclude=exclude))
    assert all(not set(row) & set(ex) for row, ex in zip(got.tolist(), exclude.tolist()))
    assert index.fallbacks < 20, index.fallbacks  # the shortlist settled (nearly) every row, not the fallback


def test_rows_too_close_for_bfloat16_are_settled_in_float32(small_blocks):
    """Keys that differ below bfloat16's resolution: the shortlist's order among them is noise; the float32
    recomputation and the rounding check must still give the exact neighbours."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 16, generator=g)
    keys = base + 1e-4 * torch.randn(600, 16, generator=g)  # cosines to `base` all within ~1e-8 of each other
    keys[300:] = torch.randn(300, 16, generator=g)
    queries = base + 0.05 * torch.randn(40, 16, generator=g)
    exclude = torch.randint(0, 600, (40, 2), generator=g)
    index = CosineIndex(keys)
    got = index.search(queries, 12, exclude=exclude)
    assert sets(got) == sets(exact_nearest_rows(queries, keys, 12, exclude=exclude))
    assert index.fallbacks > 0  # this case needs the check: without it the shortlist's ties would decide


def test_a_near_tie_across_the_recomputed_ranks_is_settled_by_the_whole_shortlist(small_blocks, monkeypatch):
    """20 clear nearest keys, then 30 whose cosines differ by ~1e-5 (bfloat16 cannot order them, float32 can),
    then a gap: the k-th (24th) falls inside the near tie, past the recomputed ranks' reach, so the whole
    shortlist is recomputed in float32 and orders them, with no exact search."""
    g = torch.Generator().manual_seed(6)
    base = F.normalize(torch.randn(16, generator=g), dim=0)
    side = F.normalize(torch.randn(16, generator=g), dim=0)
    best = base + 0.05 * torch.randn(20, 16, generator=g)
    tie = base + 0.6 * side + 3e-4 * torch.randn(30, 16, generator=g)
    rest = torch.randn(650, 16, generator=g) - 2 * base  # far below
    keys = torch.cat([best, tie, rest])[torch.randperm(700, generator=g)]
    queries = base + 0.01 * torch.randn(20, 16, generator=g)
    exclude = torch.randint(0, 700, (20, 1), generator=g)
    widths = []
    rescore = CosineIndex.rescore
    monkeypatch.setattr(CosineIndex, "rescore", lambda self, q, i: widths.append(i.shape[1]) or rescore(self, q, i))
    index = CosineIndex(keys)
    got = index.search(queries, 24, exclude=exclude)
    assert sets(got) == sets(exact_nearest_rows(queries, keys, 24, exclude=exclude))
    assert 24 + 3 * nb.MARGIN in widths and index.fallbacks == 0


def test_ties_go_to_the_exact_search(small_blocks):
    """Keys repeated many times tie exactly. Inside a tie any copies are right: a shortlist ending in a different
    row settles them; a shortlist that is one tie from end to end leaves nothing to tell, so every row is searched
    again exactly and the answer is the exact search's, tie order included."""
    g = torch.Generator().manual_seed(2)
    queries, exclude = torch.randn(30, 8, generator=g), torch.zeros(30, 1, dtype=torch.long)
    few = torch.randn(20, 8, generator=g).repeat(30, 1).to(torch.bfloat16)  # 30 copies: less than the shortlist
    got = nearest_rows(queries, few, 7, exclude=exclude) % 20
    assert torch.equal(got, exact_nearest_rows(queries, few, 7, exclude=exclude) % 20)  # the same rows' copies
    many = torch.randn(5, 8, generator=g).repeat(120, 1).to(torch.bfloat16)  # 120 copies: the whole shortlist
    index = CosineIndex(many)
    got = index.search(queries, 7, exclude=exclude)
    assert torch.equal(got, exact_nearest_rows(queries, many, 7, exclude=exclude))
    assert index.fallbacks == 30


def test_fewer_allowed_keys_than_k_repeat_excluded_ids(small_blocks):
    """60 keys, 55 excluded per row, k = 10 (the shortlist would hold 26): the 5 allowed keys, then distinct
    excluded ids, as the exact search gives them."""
    g = torch.Generator().manual_seed(3)
    keys, queries = torch.randn(60, 8, generator=g), torch.randn(4, 8, generator=g)
    exclude = torch.stack([torch.randperm(60, generator=g)[:55] for _ in range(4)])
    got = nearest_rows(queries, keys, 10, exclude=exclude)
    for row, ex in zip(got.tolist(), exclude.tolist()):
        allowed = set(range(60)) - set(ex)
        assert allowed <= set(row) and len(set(row)) == 10 and set(row) - allowed <= set(ex)


def test_without_fast_bfloat16_the_exact_search_runs(small_blocks, monkeypatch):
    monkeypatch.setattr(nb, "fast_dtype", lambda device: None)
    g = torch.Generator().manual_seed(4)
    keys, queries = torch.randn(300, 16, generator=g), torch.randn(50, 16, generator=g)
    exclude = torch.randint(0, 300, (50, 3), generator=g)
    index = CosineIndex(keys)
    assert index.units is None  # no bfloat16 copy made
    assert torch.equal(index.search(queries, 5, exclude=exclude), exact_nearest_rows(queries, keys, 5, exclude=exclude))


def test_queries_made_on_demand_one_block_at_a_time(small_blocks):
    g = torch.Generator().manual_seed(5)
    keys, queries = torch.randn(500, 16, generator=g), torch.randn(150, 16, generator=g)
    exclude = torch.randint(0, 500, (150, 2), generator=g)
    asked = []

    def make(at: torch.Tensor) -> torch.Tensor:
        asked.append(len(at))
        return queries[at]

    got = CosineIndex(keys).search_rows(make, 150, 6, exclude=exclude)
    assert sets(got) == sets(brute_force(queries, keys, 6, exclude))
    assert max(asked) <= 64
