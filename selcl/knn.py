"""k-nearest-neighbour search on L2-normalised embeddings (SPEC §5.1, also §8).

Similarity is cosine = inner product of L2-normalised float32 vectors.

* `knn_search` / `iter_knn` (batched generator) — faiss. `index="flat"`: exact
  `IndexFlatIP`; `index="ivf"`: approximate `IndexIVFFlat` (inner product, spherical
  k-means coarse quantiser) for N ~ 10⁶; `index="torch"`: torch brute force on the
  tensors' device (topk + exact tie handling), e.g. for CUDA without faiss-gpu.
  A faiss GPU index is used when `selcl.device.faiss_gpu_available()` (and `use_gpu`
  is not False); the CPU index otherwise. `build_index` builds one for reuse.
* `knn_torch` — plain batched torch matmul + stable sort, kept as a cross-check.

`exclude_self=True` means the queries ARE the keys, in the same order: we search
k+1 and remove the query's own index from its row *by index* (the authors' selection
masks column b of row b of each 100-row query chunk, which is the example itself only
in the first chunk, so for the others it stays among its own neighbours); if the self
entry is not among the k+1 (more than k exact duplicates of the query come before it),
the last entry is dropped instead.

The k neighbours are the exact ones: ties in similarity go to the lower key index (as a
stable sort would), and a float32 near-tie at the k-th place is settled in float64. faiss
keeps an arbitrary member of a tied group that straddles the k-th place, and float32
similarities are off by up to ~d·2⁻²⁴, differently on each BLAS kernel (faiss-cpu's
OpenBLAS picks one by CPU; docs/evidence.md, "How far to trust a number"). So
the exact searches ask for `MARGIN` extra hits, and rows whose k-th and (k+1)-th
similarities lie within twice that error are re-scored in float64 (`_exact_boundary`):
one set of neighbours on every host. Within a returned row, tied entries are re-sorted
lower index first.

Queries are processed in batches, so memory is O(batch·k) on top of the index; an
N×N similarity matrix never exists (faiss tiles its own BLAS blocks, 4096×1024).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from selcl.device import faiss_gpu_available

DEFAULT_BATCH = 16384      # queries per faiss call: bounds the [B, k+1+MARGIN] result buffers
GPU_MAX_K = 2048           # faiss GPU k-selection limit
_GPU_RES = {}              # one StandardGpuResources per GPU, created lazily


# ----------------------------------------------------------------------------- faiss

def _as_numpy(x: torch.Tensor) -> np.ndarray:
    """float32 C-contiguous numpy view (zero-copy for a contiguous CPU tensor)."""
    return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())


def default_nlist(n: int) -> int:
    """IVF lists: ~4·sqrt(N) (faiss' rule of thumb), at least 1."""
    return max(1, int(round(4 * math.sqrt(n))))


@dataclass
class KnnIndex:
    """A built faiss index over `keys` (reusable for several query sets)."""
    index: object           # faiss index (CPU or GPU)
    keys: np.ndarray        # [N,d] float32, what was added (for exact tie resolution)
    exact: bool             # flat (exact) vs IVF (approximate)
    gpu: bool = False       # a faiss GPU index: a search returns at most GPU_MAX_K hits


def build_index(keys: torch.Tensor, index: str = "flat", *, use_gpu: bool | None = None,
                nprobe: int = 32, nlist: int | None = None, seed: int = 0) -> KnnIndex:
    """faiss index over keys [N,d] (see `knn_search` for the arguments); pass the result
    as `index=` to `knn_search` / `iter_knn` / `select(knn_index=...)` to reuse it."""
    gpu = faiss_gpu_available() if use_gpu is None else bool(use_gpu)
    gpu = gpu and faiss_gpu_available()
    device_id = 0
    if gpu:
        device_id = keys.device.index if keys.device.type == "cuda" and keys.device.index is not None \
            else torch.cuda.current_device()
    keys_np = _as_numpy(keys)
    return KnnIndex(_build_faiss(keys_np, index, use_gpu=gpu, device_id=device_id, nlist=nlist,
                                 nprobe=nprobe, seed=seed), keys_np, exact=index == "flat", gpu=gpu)


def _build_faiss(keys: np.ndarray, index: str, *, use_gpu: bool, device_id: int,
                 nlist: int | None, nprobe: int, seed: int):
    import faiss
    n, d = keys.shape
    if index == "flat":
        cpu_index = faiss.IndexFlatIP(d)
    elif index == "ivf":
        nlist = nlist or default_nlist(n)
        quantizer = faiss.IndexFlatIP(d)
        cpu_index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        cpu_index.cp.spherical = True          # centroids on the sphere: cosine k-means
        cpu_index.cp.seed = seed
        # seeded training subsample: 40 points per list is what faiss' k-means needs;
        # more only slows training (faiss would subsample to 256/list anyway)
        n_train = min(n, 40 * nlist)
        rng = np.random.default_rng(seed)
        train = keys if n_train == n else keys[np.sort(rng.choice(n, n_train, replace=False))]
        cpu_index.train(train)
    else:
        raise ValueError(f"unknown faiss index '{index}'")
    if use_gpu:
        if device_id not in _GPU_RES:
            res = faiss.StandardGpuResources()
            res.setTempMemory(512 * 1024 * 1024)   # default grabs 18% of the card
            _GPU_RES[device_id] = res
        gpu_index = faiss.index_cpu_to_gpu(_GPU_RES[device_id], device_id, cpu_index)
        gpu_index.add(keys)
        if index == "ivf":
            gpu_index.nprobe = nprobe
        return gpu_index
    cpu_index.add(keys)
    if index == "ivf":
        cpu_index.nprobe = nprobe
    return cpu_index


def _canonical_ties(sims: torch.Tensor, idx: torch.Tensor):
    """Within each row (sorted by descending sim), put tied entries lower index first.

    Only rows that contain a tie are re-sorted (continuous data: almost none), which
    keeps this O(#tied rows · k log k) instead of a full sort of every row."""
    tied = (sims[:, 1:] == sims[:, :-1]).any(1)
    if tied.any():
        r = tied.nonzero().squeeze(1)
        s, i = sims[r], idx[r]
        o = torch.sort(i, dim=1, stable=True).indices                  # by index ...
        s, i = s.gather(1, o), i.gather(1, o)
        o = torch.sort(s, dim=1, descending=True, stable=True).indices  # ... then by sim
        sims[r], idx[r] = s.gather(1, o), i.gather(1, o)
    return sims, idx


MARGIN = 8                 # hits searched past the kk-th: room for a float32 near-tie band


def f32_error(d: int) -> float:
    """A bound on |float32 similarity − exact similarity| of two float32 unit vectors of
    dimension d, whatever kernel or summation order computed it: γ_d = d·u / (1 − d·u),
    u = 2⁻²⁴, times Σ|q_i·k_i| ≤ ‖q‖·‖k‖ (1.001: the stored norms' rounding)."""
    u = 2.0 ** -24
    return 1.001 * d * u / (1 - d * u)


def _exact_boundary(sims: torch.Tensor, idx: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, kk: int,
                    complete: bool, self_offset: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H] hits sorted by float32 similarity (H > kk; `complete`: every key) → the exact
    top kk of each row, equal similarities by lower index.

    A float32 similarity is off by up to ε = `f32_error(d)`, and BLAS kernels round
    differently (faiss-cpu's OpenBLAS picks one by CPU: docs/evidence.md, "How far to
    trust a number"). With t the kk-th hit's float32 similarity, fewer than kk keys
    can be exactly above t + ε and at least kk are at or above t − ε, so the exact kk-th
    similarity lies in [t − ε, t + ε]: a hit above t + 2ε is in the exact top kk, one under
    t − 2ε is out. Rows whose hit kk+1 lies above t − 2ε have hits in that band: those are
    re-scored in float64 and the band's best fill the places left, by (−sim, index). A row
    whose every hit lies in or above the band (it may run past them) is re-scored over the
    keys a float32 pass puts at t − 2ε or above (every member is among them, whatever the
    kernel). Exact ties at the boundary (duplicates) are such rows too.
    `self_offset`: row r's own key r + self_offset is excluded (−inf) as in the search."""
    eps2 = 2 * f32_error(keys.shape[1])
    amb = sims[:, kk - 1].double() - sims[:, kk].double() <= eps2
    out_s, out_i = sims[:, :kk].contiguous(), idx[:, :kk].contiguous()
    if not amb.any():
        return out_s, out_i
    rows = amb.nonzero().squeeze(1)
    s, ids = sims[rows].double(), idx[rows]                       # thresholds in float64 too
    t = s[:, kk - 1:kk]
    sure = s > t + eps2                                           # in, whatever the kernel
    band = (s >= t - eps2) & ~sure & (ids >= 0)                   # faiss' −1: no hit
    r, c = band.nonzero().unbind(1)
    val = torch.full_like(s, -torch.inf)
    val[r, c] = _dot64(q[rows[r]], keys[ids[r, c]])                # the band, in float64
    val = torch.where(sure, s, val)
    # the kk kept: every sure hit (fewer than kk), then the band's best by (−sim, index) ...
    o = _order_by_sim_then_index(torch.where(sure, torch.inf, val), ids)[:, :kk]
    s_b, i_b = _top_by_sim_then_index(val.gather(1, o), kk, ids.gather(1, o))   # ... in that order
    past = (s[:, -1] >= t[:, 0] - eps2).nonzero().squeeze(1)      # the band may run past the hits
    if not complete and len(past):
        for part in past.split(64):                               # [64, N] at a time
            qp = q[rows[part]]
            full = _sims_masked(qp, keys, None).double()
            if self_offset is not None:
                full[torch.arange(len(part), device=full.device), rows[part] + self_offset] = -torch.inf
            fr, fc = (full >= t[part] - eps2).nonzero().unbind(1)  # every member, on any kernel
            exact = torch.full_like(full, -torch.inf)
            exact[fr, fc] = _dot64(qp[fr], keys[fc])
            s_b[part], i_b[part] = _top_by_sim_then_index(exact, kk)
    # float64 → float32 can make two similarities equal: those again lower index first
    out_s[rows], out_i[rows] = _canonical_ties(s_b.to(out_s.dtype), i_b)
    return out_s, out_i


def _dot64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise a·b in float64 ([M, d], [M, d] → [M]): float32 → float64 is exact, and the
    float64 sum's error bound is 2⁻²⁹ of the float32 one (`f32_error`)."""
    return (a.double() * b.double()).sum(-1)


def _order_by_sim_then_index(s: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per row, the column order by descending s, equal s by lower id: [B, H] int64."""
    by_id = torch.sort(ids, dim=1, stable=True).indices                                   # by id ...
    by_sim = torch.sort(s.gather(1, by_id), dim=1, descending=True, stable=True).indices  # ... then by s
    return by_id.gather(1, by_sim)


def _top_by_sim_then_index(s: torch.Tensor, k: int, ids: torch.Tensor | None = None):
    """Per row, the k entries of largest s, equal s by lower id (`ids`; default the
    column), in that order: (sims, ids)."""
    if ids is None:
        ids = torch.arange(s.shape[1], device=s.device).expand_as(s)
    o = _order_by_sim_then_index(s, ids)[:, :k]
    return s.gather(1, o), ids.gather(1, o)


def _drop_self(sims: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor):
    """[B, k+1] → [B, k]: remove each row's own index; if absent, drop the last entry."""
    b, kk = idx.shape
    is_self = idx == rows[:, None]
    # column to drop: the self entry (first True), else the last column
    drop = torch.where(is_self.any(1), is_self.to(torch.uint8).argmax(1), kk - 1)
    # gather the other k columns in order: col j for j < drop, j+1 for j ≥ drop
    # (one gather; ~4× faster than boolean-mask indexing of the [B, k+1] arrays)
    cols = torch.arange(kk - 1)[None, :]
    cols = cols + (cols >= drop[:, None])
    return sims.gather(1, cols), idx.gather(1, cols)


def iter_knn(queries: torch.Tensor, keys: torch.Tensor, k: int, *, exclude_self: bool = False,
             index: str | KnnIndex = "flat", batch_size: int | None = None, use_gpu: bool | None = None,
             nprobe: int = 32, nlist: int | None = None, seed: int = 0
             ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Batched k-NN: yields (start, sims float32 [B,k], idx int64 [B,k]) in query order,
    on CPU for faiss, on the queries' device for index="torch".

    Consumers that only need per-batch reductions (selection votes) use this directly
    and never hold the full [Q,k] similarity array. Arguments as `knn_search`.
    """
    q_n, n = queries.shape[0], keys.shape[0]
    if exclude_self and q_n != n:
        raise ValueError("exclude_self=True needs queries == keys (same rows, same order)")
    kk = k + 1 if exclude_self else k
    if not 0 < k <= n - int(exclude_self):
        raise ValueError(f"k={k} out of range for {n} keys (exclude_self={exclude_self})")
    batch_size = batch_size or DEFAULT_BATCH

    if index == "torch":
        # O(B·N) memory per batch → cap B·N at 2²⁴ (64 MB of float32 sims)
        bs = min(batch_size, max(1, 2 ** 24 // n))
        keys = keys.to(queries.device)
        for s in range(0, q_n, bs):
            sims, idx = _torch_topk(queries[s:s + bs], keys, k,
                                    self_offset=s if exclude_self else None)
            yield s, sims, idx
        return

    if isinstance(index, KnnIndex):
        built = index
    else:
        use_gpu = use_gpu is not False and kk + 1 + MARGIN <= GPU_MAX_K   # faiss GPU: k ≤ 2048
        built = build_index(keys, index, use_gpu=use_gpu, nprobe=nprobe, nlist=nlist, seed=seed)
    keys_np, exact = built.keys, built.exact
    for s in range(0, q_n, batch_size):
        q = keys_np[s:s + batch_size] if (exclude_self and queries is keys) \
            else _as_numpy(queries[s:s + batch_size])
        # flat: extra hits tell whether a float32 near-tie straddles the kk-th place
        hits = min(kk + 1 + MARGIN, n) if exact else kk
        if built.gpu:                                    # a prebuilt GPU index: its k limit
            hits = max(kk, min(hits, GPU_MAX_K))
        d_np, i_np = built.index.search(q, hits)
        sims, idx = _canonical_ties(torch.from_numpy(d_np), torch.from_numpy(i_np))
        if hits > kk:
            sims, idx = _exact_boundary(sims, idx, torch.from_numpy(q), torch.from_numpy(keys_np), kk,
                                        complete=hits == n)
        if exclude_self:
            rows = torch.arange(s, s + q.shape[0], dtype=torch.int64)
            sims, idx = _drop_self(sims, idx, rows)
        yield s, sims, idx


def knn_search(queries: torch.Tensor, keys: torch.Tensor, k: int, *, exclude_self: bool = False,
               index: str | KnnIndex = "flat", batch_size: int | None = None, use_gpu: bool | None = None,
               nprobe: int = 32, nlist: int | None = None, seed: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """k most similar keys for every query.

    queries [Q,d], keys [N,d]: float32, L2-normalised (cosine = inner product).
    index: "flat" (exact faiss), "ivf" (faiss IVFFlat; nlist lists, default ~4·sqrt(N),
    trained on a `seed`-ed subsample; `nprobe` lists visited per query), "torch", or
    a `KnnIndex` from `build_index(keys, ...)` (must have been built on these keys).
    use_gpu: None = faiss GPU index when `faiss_gpu_available()`; False = CPU index.
    IVF rows may hold fewer than k hits when the visited lists are small: missing
    entries have idx −1 and sim −inf-like (faiss' −3.4e38).
    Returns (sims float32 [Q,k], idx int64 [Q,k]) on the queries' device, each row
    sorted by descending similarity, ties lower index first.
    """
    q_n = queries.shape[0]
    sims = torch.empty(q_n, k, dtype=torch.float32, device=queries.device)
    idx = torch.empty(q_n, k, dtype=torch.int64, device=queries.device)
    for s, sb, ib in iter_knn(queries, keys, k, exclude_self=exclude_self, index=index,
                              batch_size=batch_size, use_gpu=use_gpu, nprobe=nprobe,
                              nlist=nlist, seed=seed):
        sims[s:s + sb.shape[0]] = sb
        idx[s:s + ib.shape[0]] = ib
    return sims, idx


# ----------------------------------------------------------------------------- torch

def _sims_masked(q: torch.Tensor, keys: torch.Tensor, self_offset: int | None) -> torch.Tensor:
    """[B, N] float32 sims of a query batch; the query's own key (exclude_self) → −inf.
    Never under autocast; on CUDA from a float64 product, since a float32 one may run in
    TF32 there (a flag of the caller's), whose error is far above `f32_error`."""
    with torch.autocast(q.device.type, enabled=False):
        if q.is_cuda:
            s = (q.double() @ keys.double().T).float()
        else:
            s = q.float() @ keys.float().T
    if self_offset is not None:
        r = torch.arange(q.shape[0], device=s.device)
        s[r, r + self_offset] = -torch.inf
    return s


def _torch_topk(q: torch.Tensor, keys: torch.Tensor, k: int, self_offset: int | None):
    """Brute force for one query batch, ties → lower index, in O(B·N) (no full sort).

    torch.topk finds the k-th largest value v; everything > v is in, and of the
    entries == v the lowest-indexed ones fill the remaining places (a cumsum over
    the tie mask). The k winners are then ordered by (−sim, index). `MARGIN` more are
    kept for `_exact_boundary`, which settles float32 near-ties at the k-th place."""
    s = _sims_masked(q, keys, self_offset)
    hits = min(k + 1 + MARGIN, s.shape[1])    # then the float32 near-ties as `iter_knn`'s flat search
    v = torch.topk(s, hits, dim=1, sorted=False).values.amin(1, keepdim=True)   # hits-th best
    gt, eq = s > v, s == v
    need = hits - gt.sum(1, keepdim=True, dtype=torch.int32)
    keep = gt | (eq & (eq.cumsum(1, dtype=torch.int32) <= need))
    idx = keep.nonzero()[:, 1].view(-1, hits)               # exactly `hits` per row, ascending
    sims = s.gather(1, idx)
    o = torch.sort(sims, dim=1, descending=True, stable=True).indices
    sims, idx = sims.gather(1, o), idx.gather(1, o)
    if hits == k:
        return sims, idx
    return _exact_boundary(sims, idx, q, keys, k, complete=hits == s.shape[1], self_offset=self_offset)


def knn_torch(queries: torch.Tensor, keys: torch.Tensor, k: int, *, exclude_self: bool = False,
              batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch brute force (cross-check): same contract as `knn_search`.

    Masking the self entry to −inf and taking the top k equals "search k+1, drop the
    self entry by index, else the last", because ties are broken by index in both.
    Memory O(batch_size·N); runs on the tensors' device.
    """
    if exclude_self and queries.shape[0] != keys.shape[0]:
        raise ValueError("exclude_self=True needs queries == keys (same rows, same order)")
    out_s, out_i = [], []
    keys = keys.to(queries.device)
    for s in range(0, queries.shape[0], batch_size):
        sims = _sims_masked(queries[s:s + batch_size], keys, s if exclude_self else None)
        # a stable descending sort keeps equal sims in index order: ties → lower index
        sims, idx = torch.sort(sims, dim=1, descending=True, stable=True)
        out_s.append(sims[:, :k])
        out_i.append(idx[:, :k])
    return torch.cat(out_s), torch.cat(out_i)
