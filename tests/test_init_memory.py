"""Init methods and VocADT's neighbour search on half-precision matrices: the math runs in float32 on the rows
being used, with the same result as on a float32 copy, and no float32/float64 copy of the whole source matrix
is ever made (checked on every tensor the methods create, with small working blocks so that a block is not the
whole matrix)."""

from __future__ import annotations

import pytest
import test_init as base
import torch
import torch.nn.functional as F
from test_salt import Case
from tiny import lines, tiny_bytelevel_tokenizer, tokenizer_with_extra_merges
from torch.utils._python_dispatch import TorchDispatchMode

import vocgraft.init as init_module
import vocgraft.train.neighbours as neighbours_module
from vocgraft.init import get_method
from vocgraft.init.random import normal_rows
from vocgraft.plan import VocabPlan
from vocgraft.train.vocadt import adapter_start, nearest_rows

FAST = {"dim": 16, "epochs": 2, "min_count": 3, "threads": 1, "bucket": 5000}  # a fastText that trains in ~1 s


class LargestFloatTensor(TorchDispatchMode):
    """Records every float32/float64 tensor an op creates whose last dimension is ``width``: the largest row
    count seen is the largest float copy of (part of) a ``width``-wide matrix."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.rows = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64) and t.dim() == 2:
                if t.shape[1] == self.width and not t.is_sparse:
                    self.rows = max(self.rows, t.shape[0])
        return out


@pytest.fixture(scope="module")
def case():
    """test_init's expansion: (source, target, plan, aux tokenizer)."""
    source = tiny_bytelevel_tokenizer()
    target = tokenizer_with_extra_merges(source, base.MERGES, extra_vocab=[base.NO_MERGE, base.MU_ALPHA])
    aux = tokenizer_with_extra_merges(tokenizer_with_extra_merges(source, extra_vocab=["ĠÎ¼"]), base.AUX_MERGES)
    return source, target, VocabPlan.from_tokenizers(source, target, "expand"), aux


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(init_module, "GATHER_BLOCK", 16)  # 16 float32 rows per working block


def run(method, matrix, ctx):
    """The method as ``initialize`` runs it (no grad, the matrix as stored), and the largest float copy made."""
    probe = LargestFloatTensor(matrix.shape[1])
    with torch.no_grad(), probe:
        rows = get_method(method)(matrix, ctx)
    return rows, probe.rows


@pytest.mark.parametrize("method", [*base.BUILTIN, "focus"])
def test_methods_on_bfloat16_rows_compute_in_float32_without_a_whole_matrix_copy(case, method, small_blocks):
    source, target, plan, aux = case
    weights = base.padded_llama(len(source), tied=True).get_input_embeddings().weight.detach()
    matrix = weights.to(torch.bfloat16)

    def ctx():
        return base.ctx_for(
            plan, source, target, corpus=lines("el", 50), seed=7, aux_tokenizer=aux, resources={"fasttext": FAST}
        )

    rows, largest = run(method, matrix, ctx())
    assert rows.dtype == torch.float32 and rows.shape == (len(plan.new_ids), matrix.shape[1])
    # float32 math on exact float32 values of the bfloat16 rows: what the method gives on a float32 copy
    torch.testing.assert_close(rows, get_method(method)(matrix.float(), ctx()), atol=1e-5, rtol=1e-5)
    # never the whole matrix: gathered rows (fewer than the source has), or blocks of 16 rows (+ the new rows)
    assert largest < len(source), f"{method} made a float copy of {largest} rows of a {len(source)}-row matrix"


@pytest.mark.parametrize("method", ["salt", "salt-centered"])
def test_salt_reads_the_source_rows_in_float64_blocks_only(method, monkeypatch):
    planted = Case(group_sizes=(5, 5, 2, 6, 4))  # 22 shared tokens, 25 source rows
    matrix = planted.e_s.to(torch.bfloat16)
    reference = get_method(method)(matrix.float(), planted.ctx())
    monkeypatch.setattr(init_module, "GATHER_BLOCK", 4)  # float64 blocks of 2 rows
    rows, largest = run(method, matrix, planted.ctx())
    torch.testing.assert_close(rows, reference, atol=1e-6, rtol=1e-6)
    assert largest <= max(2, len(planted.group_of_new)), largest


def test_random_statistics_are_over_row_blocks_and_match_torch(small_blocks):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(500, 12, generator=g) * torch.linspace(0.5, 3, 12) + torch.linspace(-2, 2, 12)
    got = normal_rows(rows.to(torch.bfloat16), 20000, torch.Generator().manual_seed(1))
    exact = rows.to(torch.bfloat16).float()
    torch.testing.assert_close(got.mean(dim=0), exact.mean(dim=0), atol=0.05, rtol=0)
    torch.testing.assert_close(got.std(dim=0), exact.std(dim=0), rtol=0.03, atol=0)
    # the same draws as torch's own statistics with the same generator
    noise = torch.randn(20000, 12, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(got, exact.mean(dim=0) + exact.std(dim=0) * noise, atol=1e-5, rtol=1e-5)


def test_nearest_rows_in_key_blocks_on_bfloat16_keys_equal_a_brute_force_search():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(300, 16, generator=g).to(torch.bfloat16)
    queries = torch.randn(50, 16, generator=g)
    exclude = torch.randint(0, 300, (50, 3), generator=g)
    sims = F.normalize(queries, dim=1) @ F.normalize(keys.float(), dim=1).T
    for key_block in (7, 64, 300):
        got = nearest_rows(queries, keys, 5, exclude=exclude, key_block=key_block)
        for q in range(50):
            order = [i for i in sims[q].argsort(descending=True).tolist() if i not in exclude[q].tolist()]
            assert got[q].tolist() == order[:5], (key_block, q)


def test_nearest_rows_with_fewer_keys_than_k_after_exclusion_repeat_excluded_ids():
    keys, queries = torch.randn(6, 4), torch.randn(2, 4)
    exclude = torch.tensor([[0, 1, 2], [3, 4, 5]])
    got = nearest_rows(queries, keys, 5, exclude=exclude, key_block=2)
    for q in range(2):
        allowed = set(range(6)) - set(exclude[q].tolist())
        assert allowed <= set(got[q].tolist()) and len(set(got[q].tolist())) == 5  # the rest: excluded ids


def test_vocadt_start_on_a_bfloat16_matrix_searches_in_blocks(case, monkeypatch):
    source, target, plan, _ = case
    weights = base.padded_llama(len(source), tied=True).get_input_embeddings().weight.detach()
    matrix = weights.to(torch.bfloat16)
    reference = adapter_start(matrix.float(), plan, source, target, candidates=8, seed=0)
    monkeypatch.setattr(neighbours_module, "QUERY_BLOCK", 3)
    monkeypatch.setattr(neighbours_module, "KEY_BLOCK", 50)
    monkeypatch.setattr(neighbours_module, "SHORTLIST_BLOCK", 50)
    probe = LargestFloatTensor(matrix.shape[1])
    with probe:
        start = adapter_start(matrix, plan, source, target, candidates=8, seed=0, device="cpu")
    assert torch.equal(start.index, reference.index) and torch.equal(start.weight, reference.weight)
    assert start.index.device.type == "cpu"
    assert probe.rows <= 50 < len(source), probe.rows  # float32 blocks of 50 keys, never the whole matrix
    assert probe.rows <= 50, f"a float copy of {probe.rows} rows of a {len(source)}-row matrix"


@pytest.mark.parametrize("block", [2, 3, 1000])
def test_gathered_product_in_blocks_equals_the_dense_product(block):
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(40, 6, generator=g).to(torch.bfloat16)
    index = torch.stack([torch.randint(0, 9, (30,), generator=g), torch.randint(0, 40, (30,), generator=g)])
    weights = torch.sparse_coo_tensor(index, torch.rand(30, generator=g), (9, 40))  # repeated entries add up
    dense = weights.to_dense() @ matrix.float()
    got = init_module.gathered_product(weights, matrix, block=block)
    torch.testing.assert_close(got, dense, atol=1e-5, rtol=1e-5)
    wide = init_module.gathered_product(weights, matrix, dtype=torch.float64, block=block, out_dtype=torch.float32)
    assert wide.dtype == torch.float32
    torch.testing.assert_close(wide, (weights.to_dense().double() @ matrix.double()).float())
    shifted = init_module.gathered_product(weights, matrix, block=block, finish=lambda rows, a, b: rows + a)
    torch.testing.assert_close(shifted - got, torch.arange(9).float()[:, None].expand(9, 6) // block * block)
