"""k-NN search (SPEC §5.1) against float64 numpy / torch brute force."""
import numpy as np
import pytest
import torch

from selcl.knn import knn_search, knn_torch

faiss = pytest.importorskip("faiss")


def unit(x):
    return x / x.norm(dim=1, keepdim=True)


def with_duplicates(n, d, seed, n_groups=20, max_group=6):
    """Random unit vectors where `n_groups` vectors are copied to random other rows."""
    g = torch.Generator().manual_seed(seed)
    z = unit(torch.randn(n, d, generator=g))
    rng = np.random.default_rng(seed)
    for src in rng.choice(n, n_groups, replace=False):
        dst = rng.choice(n, rng.integers(1, max_group + 1), replace=False)
        z[torch.from_numpy(dst)] = z[int(src)].clone()
    return z


def grid_vectors(n, seed, d=4):
    """Entries ±1/2 in d=4: unit norm exactly, every similarity exact in float32
    (one of −1, −½, 0, ½, 1) — a stress test of tie handling."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy((rng.integers(0, 2, (n, d)) * 2 - 1).astype(np.float32) * 0.5)


def ref_knn(q, keys, k, exclude_self=False):
    """float64 numpy brute force, written from the definition: for each query sort all
    keys by (−sim, index); exclude_self: search k+1, remove the query's own index from the
    row, or the last entry when the query is not among the k+1."""
    Q, Kk = q.double().numpy(), keys.double().numpy()
    kk = k + 1 if exclude_self else k
    sims, idx = [], []
    for a in range(Q.shape[0]):
        s = Kk @ Q[a]
        order = sorted(range(len(s)), key=lambda j: (-s[j], j))[:kk]
        if exclude_self:
            order.remove(a) if a in order else order.pop()
        idx.append(order)
        sims.append([s[j] for j in order])
    return np.array(sims), np.array(idx, dtype=np.int64)


def check_same(sims, idx, ref_sims, ref_idx):
    assert sims.dtype == torch.float32 and idx.dtype == torch.int64
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(sims.numpy(), ref_sims, atol=2e-6)
    assert (sims[:, 1:] <= sims[:, :-1]).all()              # sorted descending


@pytest.mark.parametrize("k", [1, 7, 120])   # k ≥ 100 takes faiss' reservoir path
def test_flat_matches_bruteforce_with_duplicates(k):
    keys = with_duplicates(400, 16, seed=k)
    queries = torch.cat([keys[:50], unit(torch.randn(30, 16, generator=torch.Generator().manual_seed(1)))])
    ref_s, ref_i = ref_knn(queries, keys, k)
    check_same(*knn_search(queries, keys, k), ref_s, ref_i)
    check_same(*knn_torch(queries, keys, k, batch_size=17), ref_s, ref_i)


@pytest.mark.parametrize("k", [3, 10, 150])
def test_exclude_self_with_duplicates(k):
    # groups of up to k+3 identical vectors: for many rows the self entry is NOT first,
    # and for some it is not even among the k+1 hits
    keys = with_duplicates(300, 8, seed=10 + k, n_groups=8, max_group=min(k + 3, 40))
    ref_s, ref_i = ref_knn(keys, keys, k, exclude_self=True)
    sims, idx = knn_search(keys, keys, k, exclude_self=True, batch_size=64)
    rows = torch.arange(keys.shape[0])[:, None]
    assert not (idx == rows).any()                            # self never returned
    check_same(sims, idx, ref_s, ref_i)
    check_same(*knn_torch(keys, keys, k, exclude_self=True, batch_size=50), ref_s, ref_i)
    # the duplicates really put other rows before the self entry (the authors' bug case)
    _, i_all = ref_knn(keys, keys, k + 1)
    assert (i_all[:, 0] != np.arange(keys.shape[0])).sum() > 10


@pytest.mark.parametrize("exclude_self", [False, True])
@pytest.mark.parametrize("k", [5, 150])
def test_exact_ties_go_to_lower_index(k, exclude_self):
    z = grid_vectors(600, seed=k)
    ref_s, ref_i = ref_knn(z, z, k, exclude_self=exclude_self)
    check_same(*knn_search(z, z, k, exclude_self=exclude_self, batch_size=200), ref_s, ref_i)
    check_same(*knn_torch(z, z, k, exclude_self=exclude_self), ref_s, ref_i)
    check_same(*knn_search(z, z, k, exclude_self=exclude_self, index="torch"), ref_s, ref_i)


def test_batching_invariance():
    z = with_duplicates(600, 32, seed=3)
    base_s, base_i = knn_search(z, z, 25, exclude_self=True)
    for bs in (19, 64, 333, 5000):          # 19 < 20: faiss' non-BLAS path
        s, i = knn_search(z, z, 25, exclude_self=True, batch_size=bs)
        # faiss' BLAS path (≥ 20 queries) and its SIMD path round differently: ~1 ulp
        assert torch.equal(i, base_i) and torch.allclose(s, base_s, rtol=0, atol=1e-6)
    ts, ti = knn_torch(z, z, 25, exclude_self=True, batch_size=1000)
    for bs in (3, 64):
        s2, i2 = knn_torch(z, z, 25, exclude_self=True, batch_size=bs)
        assert torch.equal(ti, i2) and torch.allclose(ts, s2, rtol=0, atol=1e-6)


def test_exclude_self_needs_square_input():
    z = unit(torch.randn(10, 4))
    with pytest.raises(ValueError, match="queries == keys"):
        knn_search(z[:5], z, 2, exclude_self=True)
    with pytest.raises(ValueError, match="k=10 out of range"):
        knn_search(z, z, 10, exclude_self=True)                 # only 9 others


def clustered(n, d, seed, n_centres=50):
    g = torch.Generator().manual_seed(seed)
    centres = unit(torch.randn(n_centres, d, generator=g))
    a = torch.randint(0, n_centres, (n,), generator=g)
    return unit(centres[a] + 0.25 * torch.randn(n, d, generator=g) / d ** 0.5 * 4)


def test_ivf_recall_and_determinism():
    z = clustered(8000, 32, seed=0)
    k = 50
    _, exact = knn_search(z, z, k, exclude_self=True)
    nlist = 100
    _, approx = knn_search(z, z, k, exclude_self=True, index="ivf", nlist=nlist, nprobe=8, seed=1)
    hits = (approx[:, :, None] == exact[:, None, :]).any(2).float().mean().item()
    assert 0.9 < hits <= 1.0
    assert not (approx == torch.arange(len(z))[:, None]).any()
    _, again = knn_search(z, z, k, exclude_self=True, index="ivf", nlist=nlist, nprobe=8, seed=1)
    assert torch.equal(approx, again)
    # visiting every list is exact search
    s_all, i_all = knn_search(z[:2000], z[:2000], 10, exclude_self=True, index="ivf", nlist=20, nprobe=20)
    s_ex, i_ex = knn_search(z[:2000], z[:2000], 10, exclude_self=True)
    assert torch.equal(i_all, i_ex) and torch.allclose(s_all, s_ex, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_results_on_queries_device_cuda():
    z = with_duplicates(500, 16, seed=5)
    s_cpu, i_cpu = knn_search(z, z, 12, exclude_self=True)
    for index in ("flat", "torch"):
        s, i = knn_search(z.cuda(), z.cuda(), 12, exclude_self=True, index=index)
        assert s.is_cuda and i.is_cuda
        assert torch.equal(i.cpu(), i_cpu) and torch.allclose(s.cpu(), s_cpu, atol=1e-5)


def test_prebuilt_index_is_reusable():
    from selcl.knn import build_index
    z = clustered(3000, 16, seed=4)
    for kind, kw in (("flat", {}), ("ivf", dict(nlist=30, nprobe=5, seed=2))):
        built = build_index(z, kind, **kw)
        a = knn_search(z, z, 20, exclude_self=True, index=built)
        b = knn_search(z, z, 20, exclude_self=True, index=kind, **kw)
        c = knn_search(z[:100], z, 20, index=built)
        assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])
        assert torch.equal(c[1][:, 1:], a[1][:100, :19])        # row 0 of c: the query itself


def test_a_gpu_index_is_searched_within_its_k_limit():
    """faiss GPU returns at most GPU_MAX_K hits: a prebuilt index marked `gpu` (here a CPU
    index standing in) is searched for no more, and the neighbours stay exact."""
    import dataclasses

    from selcl.knn import GPU_MAX_K, build_index

    z = with_duplicates(GPU_MAX_K + 60, 8, seed=7)
    built = build_index(z, "flat", use_gpu=False)
    assert built.gpu is False

    asked = []

    class Recording:                                  # the search's k, as a GPU index would see it
        def search(self, q, k):
            asked.append(k)
            return built.index.search(q, k)

    as_gpu = dataclasses.replace(built, index=Recording(), gpu=True)
    k = GPU_MAX_K - 4                                 # k + 1 + MARGIN hits would exceed the limit
    sims, idx = knn_search(z[:6], z, k, index=as_gpu)
    assert asked and max(asked) <= GPU_MAX_K
    ref_s, ref_i = ref_knn(z[:6], z, k)
    check_same(sims, idx, ref_s, ref_i)


def near_ties(n=2000, d=128, k=10, n_queries=120, exclude_self=False, seed=0):
    """Random float32 unit vectors, and for each of the first `n_queries` rows a copy of the
    k-th neighbour of its search (`exclude_self` as there) with one entry moved by one
    float32 ulp, appended: that row's k-th and (k+1)-th neighbours then differ by ~1e-9,
    under float32 GEMM's error (~1e-8 for d = 128), so a float32 search orders them as its
    kernel rounds."""
    g = torch.Generator().manual_seed(seed)
    keys = unit(torch.randn(n, d, generator=g))
    _, ref_i = ref_knn(keys[:n_queries], keys, k, exclude_self=exclude_self)
    twins = keys[torch.from_numpy(ref_i[:, k - 1])].clone()
    col = torch.randint(d, (n_queries,), generator=g)
    rows = torch.arange(n_queries)
    up = torch.rand(n_queries, generator=g) < 0.5
    twins[rows, col] = torch.nextafter(twins[rows, col], torch.where(up, 1.0, -1.0))
    return torch.cat([keys, twins]), n_queries


@pytest.mark.parametrize("index", ["flat", "torch"])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_the_kth_neighbour_is_exact_at_float32_near_ties(index, exclude_self):
    """The top-k set is the exact one (float64, ties → lower index) where the k-th and
    (k+1)-th similarities lie closer than float32's error: the same on every BLAS
    kernel (faiss-cpu's OpenBLAS picks one by CPU; docs/evidence.md). The
    planted twins cross the k-th place in about a quarter of the rows."""
    k = 10
    keys, nq = near_ties(k=k, exclude_self=exclude_self)
    q = keys if exclude_self else keys[:nq]          # exclude_self: the queries are the keys
    _, ref_i = ref_knn(q[:nq], keys, k, exclude_self=exclude_self)
    sims, idx = knn_search(q, keys, k, index=index, exclude_self=exclude_self)
    np.testing.assert_array_equal(np.sort(idx[:nq].numpy(), 1), np.sort(ref_i, 1))
    assert (sims[:, 1:] <= sims[:, :-1]).all()
