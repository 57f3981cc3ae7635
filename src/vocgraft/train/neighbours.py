"""Cosine nearest rows at vocabulary scale (VocADT's candidates): a bfloat16 shortlist settled in float32.

An exact float32 search of Llama-3's 128K new rows against its 128K old rows is 1.4e14 FLOP: some 14 minutes per
matrix on 2 CPU cores, plus a top-k over 1.6e10 similarities that costs as much again. :class:`CosineIndex` does
the same search in three steps:

1. **Shortlist** in bfloat16 (AMX / avx512_bf16 on a CPU, tensor cores on a GPU: about 5x float32's matmul
   rate): unit-norm copies of the keys and queries, one ``QUERY_BLOCK x SHORTLIST_BLOCK`` product at a time,
   keep each query's ``k + 3 MARGIN`` best keys. No top-k over a whole block: a block's similarities are reduced
   to the max of each group of ``GROUP`` keys (one pass), only the groups above the query's running threshold
   (its ``k + 3 MARGIN``-th best so far) are looked into, and their few hits merge into the running shortlist.
2. **Settle the boundary** in float32: the shortlist's ranks ``k - MARGIN .. k + MARGIN`` (where the k-th
   neighbour falls) are recomputed from the stored rows as the exact search computes them, and the k nearest are
   the shortlist's first ``k - MARGIN`` plus the best of the recomputed ones.
3. **Check** per query that rounding cannot have changed the answer: with ``eps`` twice the largest bfloat16
   error seen on the recomputed ranks (at least the output's rounding), the first ``k - MARGIN`` must beat every
   other key by more than ``eps``, and the chosen boundary rows must beat every key not recomputed (none scores
   above rank ``k + MARGIN``, in bfloat16) by more than ``eps``. A query that fails has its whole shortlist
   recomputed (then only the last condition applies, against the shortlist's last rank); one that fails again,
   or that has fewer than ``k + 3 MARGIN`` keys left after its exclusions, is searched again exactly
   (:func:`exact_nearest_rows`).

So the neighbour *set* is the exact search's (ties aside: keys closer than float32's rounding may swap), in
descending order of similarity as computed (bfloat16 above the boundary, float32 on it), not always float32's order.
Where bfloat16 is not fast (a CPU without native bfloat16), the exact search runs instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

QUERY_BLOCK = 2048  # queries per block
KEY_BLOCK = 8192  # keys per block of the exact search (cast to float32 one block at a time) and of normalization
SHORTLIST_BLOCK = 32768  # keys per block of the shortlist: QUERY_BLOCK x SHORTLIST_BLOCK bfloat16 similarities
GROUP = 32  # keys per group max in the shortlist's one pass over a block
MARGIN = 16  # ranks before and after the k-th recomputed in float32 (the shortlist holds 2 MARGIN more)
SAFETY = 2.0  # eps = SAFETY x the largest bfloat16 error seen on the recomputed ranks
RESCORE_ELEMENTS = 1 << 23  # float32 elements of stored rows gathered per step of the recomputation (32 MiB)


def fast_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 where its matmul is fast (a GPU, a CPU with native bfloat16), else None (search exactly)."""
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and torch.backends.mkldnn.is_available():
        try:
            if torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return torch.bfloat16
        except (AttributeError, RuntimeError):
            pass
    return None


def nearest_rows(
    queries: torch.Tensor, keys: torch.Tensor, k: int, *, exclude: torch.Tensor, key_block: int | None = None
) -> torch.Tensor:
    """Ids of the ``k`` rows of ``keys`` most cosine-similar to each query, skipping the ids in ``exclude``, on the
    CPU (:class:`CosineIndex`, built for one call). When fewer than k keys remain after exclusion the tail repeats
    excluded ids (they get weight 0, so nothing changes)."""
    return CosineIndex(keys, key_block=key_block).search(queries, k, exclude=exclude)


class CosineIndex:
    """The keys' float32 norms and (fast path) a unit-norm copy in the compute dtype, made once for many searches.

    The copy is the only whole-matrix tensor made: in bfloat16 the size of a bfloat16 checkpoint's matrix (half a
    float32 one), built one key block at a time; float32 exists for one block only."""

    def __init__(self, keys: torch.Tensor, *, key_block: int | None = None, dtype: torch.dtype | None = None):
        """``key_block``: keys per block of every step (default ``KEY_BLOCK``, and ``SHORTLIST_BLOCK`` for the
        shortlist, whose blocks are bfloat16 already: larger blocks spread its per-block work thinner)."""
        started = time.perf_counter()
        self.keys, self.key_block = keys, key_block or KEY_BLOCK
        self.shortlist_block = key_block or SHORTLIST_BLOCK
        self.dtype = dtype if dtype is not None else fast_dtype(keys.device)
        self.scratch = Scratch()
        self.norms = torch.empty(keys.shape[0], device=keys.device)
        self.units = None if self.dtype is None else torch.empty(keys.shape, dtype=self.dtype, device=keys.device)
        for lo in range(0, keys.shape[0], self.key_block):
            hi = min(lo + self.key_block, keys.shape[0])
            block = self.scratch.take("keys", (hi - lo, keys.shape[1]), torch.float32, keys.device)
            block.copy_(keys[lo:hi])
            torch.linalg.vector_norm(block, dim=1, out=self.norms[lo:hi])
            self.norms[lo:hi].clamp_min_(1e-12)  # F.normalize's eps
            if self.units is not None:
                self.units[lo:hi] = block.div_(self.norms[lo:hi, None])
        # a finite floor for excluded keys, below any similarity: they sort after every allowed key and before the
        # shortlist's empty slots (-inf)
        self.banned = torch.finfo(self.dtype or torch.float32).min
        self.fallbacks = 0  # queries searched again exactly (see ``search``), over every search so far
        self.seconds = {"index": time.perf_counter() - started, "shortlist": 0.0, "settle": 0.0, "exact": 0.0}

    def search(self, queries: torch.Tensor, k: int, *, exclude: torch.Tensor) -> torch.Tensor:
        """``[len(queries), k]`` ids on the CPU (see the module docstring)."""
        return self.search_rows(lambda index: queries[index.to(queries.device)], len(queries), k, exclude=exclude)

    def search_rows(self, make: Callable[[torch.Tensor], torch.Tensor], count: int, k: int, *, exclude: torch.Tensor):
        """:meth:`search` for ``count`` queries made on demand: ``make(index)`` gives the rows ``index`` (a CPU
        tensor of ids in ``range(count)``), so that no more than ``QUERY_BLOCK`` float32 queries exist at once."""
        n_keys = self.keys.shape[0]
        k = min(k, n_keys)
        short = k + 3 * MARGIN  # the shortlist: MARGIN past the recomputed ranks, 2 MARGIN more for a retry
        out = torch.empty(count, k, dtype=torch.long)
        exact = self.units is None or short >= n_keys  # nothing to prune: the exact search is the whole work
        redo = []
        for start in range(0, count, QUERY_BLOCK):
            index = torch.arange(start, min(start + QUERY_BLOCK, count))
            if exact:
                redo.append(index)
                continue
            q = F.normalize(make(index).to(self.keys.device, torch.float32), dim=1)
            tick = time.perf_counter()
            values, ids = self.shortlist(q.to(self.dtype), exclude[index].to(self.keys.device), short)
            tock = time.perf_counter()
            found, settled = self.settle(q, values, ids, k)
            self.seconds["shortlist"] += tock - tick
            self.seconds["settle"] += time.perf_counter() - tock
            out[index] = found.cpu()
            redo.append(index[~settled.cpu()])
        # rounding too close to call, or fewer allowed keys than the shortlist holds: searched again exactly, all
        # such queries in one pass over the keys (each pass casts every key block to float32)
        redo = torch.cat(redo) if redo else torch.empty(0, dtype=torch.long)
        if not exact:
            self.fallbacks += len(redo)
        tick = time.perf_counter()
        for start in range(0, len(redo), QUERY_BLOCK):
            index = redo[start : start + QUERY_BLOCK]
            out[index] = self.exact(make(index), k, exclude[index])
        self.seconds["exact"] += time.perf_counter() - tick
        return out

    def shortlist(self, q: torch.Tensor, banned: torch.Tensor, short: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's ``short`` best keys in the compute dtype: values (float32, descending) and ids."""
        m, device = len(q), q.device
        row_of = torch.arange(m, device=device)[:, None].expand_as(banned)
        best_v = torch.empty(m, 0, device=device)
        best_i = torch.empty(m, 0, dtype=torch.long, device=device)
        for lo in range(0, self.units.shape[0], self.shortlist_block):
            hi = min(lo + self.shortlist_block, self.units.shape[0])
            sims = torch.matmul(q, self.units[lo:hi].T, out=self.scratch.take("sims", (m, hi - lo), self.dtype, device))
            inside = (banned >= lo) & (banned < hi)
            sims[row_of[inside], banned[inside] - lo] = self.banned
            n = hi - lo
            group = GROUP if n % GROUP == 0 else 1
            width = n // group
            # sims.view(m, group, width): key lo + c + j * width is in group c (strided groups: the max over j
            # runs along contiguous memory)
            grouped = sims.view(m, group, width)
            maxima = grouped.amax(dim=1)
            if best_v.shape[1] >= short:
                threshold = best_v[:, short - 1]  # a key must beat the running short-th best
            elif width >= short:
                # short groups whose max is at least this: at least `short` keys reach it (the comparison below
                # is strict, so one step down)
                threshold = maxima.topk(short, dim=1).values[:, -1].float().nextafter(torch.tensor(-torch.inf))
            else:
                threshold = torch.full((m,), -torch.inf, device=device)
            rows, cols = (maxima > threshold[:, None]).nonzero(as_tuple=True)
            if len(rows) == 0:
                continue
            candidates = grouped[rows, :, cols]  # [hits, group]
            hit, j = (candidates > threshold[rows, None]).nonzero(as_tuple=True)
            rows, ids = rows[hit], lo + cols[hit] + j * width
            values = candidates[hit, j].float()
            pad_v, pad_i = _padded(rows, ids, values, m)
            merged_v = torch.cat([best_v, pad_v], dim=1)
            best_v, order = merged_v.topk(min(short, merged_v.shape[1]), dim=1)
            best_i = torch.cat([best_i, pad_i], dim=1).gather(1, order)
        return best_v, best_i

    def settle(
        self, q: torch.Tensor, values: torch.Tensor, ids: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The k nearest from a shortlist, and per query whether rounding is ruled out (module docstring, 2-3)."""
        first = max(k - MARGIN, 0)  # ranks before `first` are taken as they are; the ranks from `first` recomputed
        stop = k + MARGIN  # ... up to `stop`: no key ranked from `stop` on, or off the shortlist, scores above this
        exact = self.rescore(q, ids[:, first:stop])
        take = k - first
        exact_sorted, order = exact.sort(dim=1, descending=True)
        found = torch.cat([ids[:, :first], ids[:, first:stop].gather(1, order[:, :take])], dim=1)
        # eps: twice the largest error seen, and at least the output's own rounding (half a unit in the last
        # place) at the largest value it is applied to
        half_ulp = torch.finfo(self.dtype).eps / 2
        seen = (exact - values[:, first:stop]).abs().amax(dim=1)
        eps = SAFETY * torch.maximum(seen, values[:, max(first - 1, 0)].abs() * half_ulp)
        bound = values[:, stop]  # the most a key not recomputed can score in the compute dtype
        beaten = exact_sorted[:, take]  # the best recomputed rank left out (there are MARGIN of them)
        last = values[:, -1]
        settled = (exact_sorted[:, take - 1] > bound + eps) & (last > self.banned)
        if first:
            above = values[:, first - 1] - eps  # the least the first ranks can be worth in float32
            settled &= (above > beaten) & (above > bound + eps)
        # not settled: the whole shortlist recomputed, which then only has to beat the keys off it (2 MARGIN more
        # ranks of room below the k-th)
        retry = (~settled & (last > self.banned)).nonzero().squeeze(1)
        if len(retry):
            exact = self.rescore(q[retry], ids[retry])
            exact_sorted, order = exact.sort(dim=1, descending=True)
            seen = (exact - values[retry]).abs().amax(dim=1)
            eps = SAFETY * torch.maximum(seen, values[retry, 0].abs() * half_ulp)
            ok = exact_sorted[:, k - 1] > last[retry] + eps
            found[retry[ok]] = ids[retry[ok]].gather(1, order[ok, :k])
            settled[retry[ok]] = True
        return found, settled

    def rescore(self, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Float32 cosine of each query with its ``ids`` (``[m, w]``), from the stored rows."""
        out = torch.empty(*ids.shape, 1, device=q.device)
        step = max(1, RESCORE_ELEMENTS // ids[0].numel() // self.keys.shape[1])  # queries per step
        for s in range(0, len(q), step):
            chunk = ids[s : s + step]
            gathered = F.embedding(chunk, self.keys)  # [chunk, width, hidden]: a fast row gather
            rows = self.scratch.take("rows", gathered.shape, torch.float32, q.device).copy_(gathered)
            torch.bmm(rows, q[s : s + step, :, None], out=out[s : s + step])
        return out[..., 0] / self.norms[ids]

    def exact(self, queries: torch.Tensor, k: int, exclude: torch.Tensor) -> torch.Tensor:
        return exact_nearest_rows(
            queries, self.keys, k, exclude=exclude, key_block=self.key_block, norms=self.norms, scratch=self.scratch
        )


class Scratch:
    """Working tensors reused from block to block: a fresh large CPU tensor is fresh pages from the system, and
    faulting them in costs as much as the arithmetic done on them."""

    def __init__(self):
        self.flat: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device) -> torch.Tensor:
        need = 1
        for size in shape:
            need *= size
        flat = self.flat.get(name)
        if flat is None or flat.numel() < need or flat.dtype != dtype or flat.device != torch.device(device):
            flat = self.flat[name] = torch.empty(need, dtype=dtype, device=device)
        return flat[:need].view(shape)


def _padded(
    rows: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits as ``[m, most hits of a row]`` tensors, ``-inf`` (id 0) in the empty slots; ``rows`` ascending."""
    counts = torch.bincount(rows, minlength=m)
    before = counts.cumsum(0) - counts
    slot = torch.arange(len(rows), device=rows.device) - before[rows]
    width = int(counts.max())
    pad_v = torch.full((m, width), -torch.inf, device=values.device)
    pad_i = torch.zeros(m, width, dtype=torch.long, device=ids.device)
    pad_v[rows, slot] = values
    pad_i[rows, slot] = ids
    return pad_v, pad_i


def exact_nearest_rows(
    queries: torch.Tensor,
    keys: torch.Tensor,
    k: int,
    *,
    exclude: torch.Tensor,
    key_block: int | None = None,
    norms: torch.Tensor | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """The exact float32 search (the reference :class:`CosineIndex` must agree with, and its fallback).

    Runs on ``keys``' device, blocked over queries (``QUERY_BLOCK``) and keys (``key_block``, default
    ``KEY_BLOCK``): only a block of keys is cast to float32 at a time, and only ``QUERY_BLOCK x key_block``
    similarities exist at once (divided by the keys' norms: cheaper than normalizing the block when the queries are
    fewer than the hidden size); each block's top k merge into a running top k. When fewer than k keys remain
    after exclusion the tail repeats excluded ids (they get weight 0, so nothing changes)."""
    device, key_block = keys.device, key_block or KEY_BLOCK
    k = min(k, keys.shape[0])
    if norms is None:
        norms = torch.cat(
            [keys[s : s + key_block].to(torch.float32).norm(dim=1) for s in range(0, keys.shape[0], key_block)]
        ).clamp_min(1e-12)  # F.normalize's eps
    scratch = scratch or Scratch()
    out = torch.empty(len(queries), k, dtype=torch.long)
    for start in range(0, len(queries), QUERY_BLOCK):
        stop = start + QUERY_BLOCK
        q = F.normalize(queries[start:stop].to(device, torch.float32), dim=1)
        banned = exclude[start:stop].to(device)
        row_of = torch.arange(len(q), device=device)[:, None].expand_as(banned)
        best_v = best_i = None
        for lo in range(0, keys.shape[0], key_block):
            hi = min(lo + key_block, keys.shape[0])
            block = scratch.take("keys", (hi - lo, keys.shape[1]), torch.float32, device).copy_(keys[lo:hi])
            sims = q @ block.T
            sims /= norms[lo:hi]
            inside = (banned >= lo) & (banned < hi)
            sims[row_of[inside], banned[inside] - lo] = float("-inf")
            values, ids = sims.topk(min(k, hi - lo), dim=1)
            ids += lo
            if best_v is not None:
                merged = torch.cat([best_v, values], dim=1)
                values, order = merged.topk(min(k, merged.shape[1]), dim=1)
                ids = torch.cat([best_i, ids], dim=1).gather(1, order)
            best_v, best_i = values, ids
        out[start:stop] = best_i.cpu()
    return out
