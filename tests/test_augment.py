"""Tests for selcl.augment (SPEC §3): shapes, parameter distributions, fidelity to
torchvision.transforms.v2.functional and to brute-force float64 references,
reproducibility."""
import math

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T1
import torchvision.transforms.v2.functional as TF

from selcl import augment as A

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
TV_LUMA = (0.2989, 0.587, 0.114)     # torchvision's tensor kernels use 0.2989 for R

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def gen(seed, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def rand_u8(shape, seed=0, device="cpu"):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen(seed)).to(device)


def rand_float(shape, seed=0):
    return torch.rand(shape, generator=gen(seed))


# ---------------------------------------------------------------------------
# shapes, dtypes, ranges, devices
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_shapes_ranges_device(device):
    x = rand_u8((16, 3, 32, 32), device=device)
    g = gen(1, device)
    for out in (A.strong_augment(x, g, (0, 0, 0), (1, 1, 1)),
                A.weak_augment(x, g, (0, 0, 0), (1, 1, 1))):
        assert out.shape == (16, 3, 32, 32) and out.dtype == torch.float32
        assert out.device == x.device
        assert out.min() >= 0 and out.max() <= 1          # before normalisation: [0, 1]
    mean, std = torch.tensor(CIFAR_MEAN), torch.tensor(CIFAR_STD)
    lo, hi = (-mean / std).view(1, 3, 1, 1), ((1 - mean) / std).view(1, 3, 1, 1)
    for out in (A.strong_augment(x, g, CIFAR_MEAN, CIFAR_STD),
                A.weak_augment(x, g, CIFAR_MEAN, CIFAR_STD)):
        out = out.cpu()
        assert (out >= lo - 1e-5).all() and (out <= hi + 1e-5).all()
        assert not torch.allclose(out, out.clamp(0, 1))   # normalisation was applied
    assert A.strong_augment(x, g, CIFAR_MEAN, CIFAR_STD, size=24).shape == (16, 3, 24, 24)
    assert A.strong_augment(x, g, CIFAR_MEAN, CIFAR_STD, size=(20, 28)).shape == (16, 3, 20, 28)


def test_normalize_matches_reference():
    x = rand_u8((4, 3, 8, 8))
    ref = (x.double() / 255 - torch.tensor(CIFAR_MEAN, dtype=torch.float64).view(1, 3, 1, 1)) \
        / torch.tensor(CIFAR_STD, dtype=torch.float64).view(1, 3, 1, 1)
    out = A.normalize(x, CIFAR_MEAN, CIFAR_STD)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=0)
    # float input in [0,1] is taken as already scaled, and is not modified
    xf = x.float() / 255
    xf0 = xf.clone()
    torch.testing.assert_close(A.normalize(xf, CIFAR_MEAN, CIFAR_STD), out)
    assert torch.equal(xf, xf0)
    xf = x.float() / 255
    A.strong_augment(xf, gen(0), CIFAR_MEAN, CIFAR_STD)
    assert torch.equal(xf, xf0)


# ---------------------------------------------------------------------------
# RandomResizedCrop sampler
# ---------------------------------------------------------------------------

def _reference_boxes(B, H, W, seed, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), tries=10):
    """torchvision's RandomResizedCrop.get_params written as a per-sample loop, fed
    with the same uniform numbers the vectorised sampler draws (same order)."""
    g = gen(seed)
    u = torch.rand((B, tries, 2), generator=g, dtype=torch.float64)
    uij = torch.rand((B, 2), generator=g, dtype=torch.float64)
    area = H * W
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    out = []
    for b in range(B):
        for t in range(tries):
            ta = area * (scale[0] + (scale[1] - scale[0]) * u[b, t, 0].item())
            ar = math.exp(lr0 + (lr1 - lr0) * u[b, t, 1].item())
            w = int(round(math.sqrt(ta * ar)))
            h = int(round(math.sqrt(ta / ar)))
            if 0 < w <= W and 0 < h <= H:
                i = int(uij[b, 0].item() * (H - h + 1))
                j = int(uij[b, 1].item() * (W - w + 1))
                break
        else:
            in_ratio = W / H
            if in_ratio < min(ratio):
                w, h = W, int(round(W / min(ratio)))
            elif in_ratio > max(ratio):
                h, w = H, int(round(H * max(ratio)))
            else:
                w, h = W, H
            i, j = (H - h) // 2, (W - w) // 2
        out.append((i, j, h, w))
    return torch.tensor(out, dtype=torch.long)


@pytest.mark.parametrize("H,W", [(32, 32), (8, 64), (64, 8)])
def test_crop_sampler_matches_loop_reference(H, W):
    boxes = A.sample_resized_crop_params(500, H, W, gen(3))
    ref = _reference_boxes(500, H, W, 3)
    assert torch.equal(boxes, ref)


def test_crop_params_in_range():
    B, H, W = 4000, 32, 32
    boxes = A.sample_resized_crop_params(B, H, W, gen(0)).double()
    i, j, h, w = boxes.unbind(1)
    assert (h >= 1).all() and (w >= 1).all() and (i >= 0).all() and (j >= 0).all()
    assert (i + h <= H).all() and (j + w <= W).all()
    # h, w are rounded from real values within ±0.5, so the real area / ratio must
    # intersect the allowed ranges
    area_lo, area_hi = (h - 0.5) * (w - 0.5) / (H * W), (h + 0.5) * (w + 0.5) / (H * W)
    assert (area_hi >= 0.08).all() and (area_lo <= 1.0).all()
    r_lo, r_hi = (w - 0.5) / (h + 0.5), (w + 0.5) / (h - 0.5)
    assert (r_hi >= 3 / 4).all() and (r_lo <= 4 / 3).all()
    frac = h * w / (H * W)
    assert frac.min() < 0.12 and frac.max() > 0.95        # the whole range is used
    # corner uniform over valid positions: i / (H - h) has mean ≈ 0.5
    m = h < H
    assert abs((i[m] / (H - h[m])).mean().item() - 0.5) < 0.03


def test_crop_sampler_fallback_is_centre_crop():
    # a 4×200 strip with scale ≥ 0.9: no candidate fits, every box is the centre
    # crop with the ratio clamped to 4/3: h = 4, w = round(4·4/3) = 5
    boxes = A.sample_resized_crop_params(50, 4, 200, gen(0), scale=(0.9, 1.0))
    assert (boxes == torch.tensor([0, (200 - 5) // 2, 4, 5])).all()


def test_crop_sampler_distribution_matches_torchvision():
    B, H, W = 4000, 32, 32
    ours = A.sample_resized_crop_params(B, H, W, gen(5)).double()
    img = torch.zeros(3, H, W)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tv = torch.tensor([T1.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
                           for _ in range(B)], dtype=torch.float64)
    for boxes_a, boxes_b in [(ours, tv)]:
        fa = boxes_a[:, 2] * boxes_a[:, 3] / (H * W)
        fb = boxes_b[:, 2] * boxes_b[:, 3] / (H * W)
        assert abs(fa.mean() - fb.mean()) < 0.03
        la = torch.log(boxes_a[:, 3] / boxes_a[:, 2])
        lb = torch.log(boxes_b[:, 3] / boxes_b[:, 2])
        assert abs(la.mean() - lb.mean()) < 0.02
        # whole distributions, not only means (a symmetric wrong ratio range or a shifted
        # scale range keeps the means): two-sample Kolmogorov–Smirnov statistic of the area,
        # |log ratio| and the box centre, under its 0.1 % critical value 1.95·√(2/B) ≈ 0.044
        for name, a, b in [("area", fa, fb), ("|log ratio|", la.abs(), lb.abs()),
                           ("centre row", boxes_a[:, 0] + boxes_a[:, 2] / 2, boxes_b[:, 0] + boxes_b[:, 2] / 2),
                           ("centre col", boxes_a[:, 1] + boxes_a[:, 3] / 2, boxes_b[:, 1] + boxes_b[:, 3] / 2)]:
            assert _ks(a, b) < 1.95 * math.sqrt(2 / B), name


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample KS statistic: the largest gap between the two empirical CDFs."""
    grid = torch.cat([a, b]).unique()
    cdf = lambda x: torch.searchsorted(x.sort().values, grid, right=True).double() / len(x)  # noqa: E731
    return float((cdf(a) - cdf(b)).abs().max())


def test_the_distribution_check_sees_a_wrong_range():
    """The check above can fail: a ratio range of (1/2, 2) keeps the mean log ratio at
    about 0 but not its spread, and a scale range of (0.13, 1) shifts the areas."""
    B, H, W = 4000, 32, 32
    img = torch.zeros(3, H, W)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        boxes = {key: torch.tensor([T1.RandomResizedCrop.get_params(img, scale, ratio) for _ in range(B)],
                                   dtype=torch.float64)
                 for key, scale, ratio in [("paper", (0.08, 1.0), (3 / 4, 4 / 3)), ("ratio", (0.08, 1.0), (1 / 2, 2)),
                                          ("scale", (0.13, 1.0), (3 / 4, 4 / 3))]}
    area = {k: v[:, 2] * v[:, 3] / (H * W) for k, v in boxes.items()}
    ratio = {k: torch.log(v[:, 3] / v[:, 2]).abs() for k, v in boxes.items()}
    bar = 1.95 * math.sqrt(2 / B)
    assert _ks(ratio["ratio"], ratio["paper"]) > bar
    assert _ks(area["scale"], area["paper"]) > bar


# ---------------------------------------------------------------------------
# other parameter distributions
# ---------------------------------------------------------------------------

def test_strong_param_frequencies():
    B = 5000
    p = A.sample_strong_params(B, 32, 32, gen(7))
    assert abs(p["flip"].double().mean().item() - 0.5) < 0.03
    assert abs(p["gray"].double().mean().item() - 0.2) < 0.03
    jit = p["jitter"]
    assert abs(jit["apply"].double().mean().item() - 0.8) < 0.03
    order = jit["order"]
    assert (order.sort(dim=1).values == torch.arange(4)).all()        # permutations
    for slot in range(4):
        for op in range(4):
            assert abs((order[:, slot] == op).double().mean().item() - 0.25) < 0.03
    f = jit["factors"]
    assert (f[:, :3] >= 0.6).all() and (f[:, :3] <= 1.4).all()
    assert (f[:, 3] >= -0.1).all() and (f[:, 3] <= 0.1).all()
    assert (f[:, :3].mean(0) - 1).abs().max() < 0.02 and f[:, 3].mean().abs() < 0.005
    assert f[:, :3].min() < 0.61 and f[:, :3].max() > 1.39


def test_weak_param_frequencies():
    p = A.sample_weak_params(5000, gen(2), padding=4)
    for k in ("top", "left"):
        counts = torch.bincount(p[k], minlength=9)
        assert counts.numel() == 9                           # offsets in 0..8
        assert (counts > 5000 / 9 * 0.8).all()               # ≈ uniform
    assert abs(p["flip"].double().mean().item() - 0.5) < 0.03


# ---------------------------------------------------------------------------
# fidelity: resample
# ---------------------------------------------------------------------------

def test_full_box_is_identity_and_flip():
    x = rand_float((4, 3, 32, 32))
    box = torch.tensor([[0, 0, 32, 32]] * 4)
    no = torch.zeros(4, dtype=torch.bool)
    torch.testing.assert_close(A.resized_crop_flip(x, box, no, 32), x, atol=1e-5, rtol=0)
    torch.testing.assert_close(A.resized_crop_flip(x, box, ~no, 32), torch.flip(x, dims=[3]),
                               atol=1e-5, rtol=0)


def _bilinear_reference(img, i, j, h, w, S, flip):
    """crop img[:, i:i+h, j:j+w] and resize to S×S: half-pixel centres, source index
    clamped into the crop (torch/torchvision bilinear, align_corners=False)."""
    crop = img[:, i:i + h, j:j + w].double()
    out = torch.zeros(img.shape[0], S, S, dtype=torch.float64)
    for y in range(S):
        sy = min(max((y + 0.5) * h / S - 0.5, 0.0), h - 1)
        y0 = int(math.floor(sy)); y1 = min(y0 + 1, h - 1); ly = sy - y0
        for x in range(S):
            sx = min(max((x + 0.5) * w / S - 0.5, 0.0), w - 1)
            x0 = int(math.floor(sx)); x1 = min(x0 + 1, w - 1); lx = sx - x0
            out[:, y, x] = ((1 - ly) * (1 - lx) * crop[:, y0, x0] + (1 - ly) * lx * crop[:, y0, x1]
                            + ly * (1 - lx) * crop[:, y1, x0] + ly * lx * crop[:, y1, x1])
    return torch.flip(out, dims=[2]) if flip else out


def test_resample_matches_bilinear_reference():
    x = rand_float((6, 3, 12, 12), seed=4)
    boxes = torch.tensor([[0, 0, 12, 12], [2, 3, 5, 7], [0, 0, 1, 1],
                          [6, 1, 6, 11], [11, 11, 1, 1], [3, 0, 9, 4]])
    flip = torch.tensor([False, True, False, True, True, False])
    out = A.resized_crop_flip(x, boxes, flip, 12)
    for b in range(6):
        ref = _bilinear_reference(x[b], *boxes[b].tolist(), 12, bool(flip[b]))
        torch.testing.assert_close(out[b].double(), ref, atol=1e-5, rtol=0)


def test_resample_matches_torchvision():
    B, H, S = 32, 32, 32
    x = rand_float((B, 3, H, H), seed=8)
    boxes = A.sample_resized_crop_params(B, H, H, gen(9))
    flip = torch.rand(B, generator=gen(10)) < 0.5
    out = A.resized_crop_flip(x, boxes, flip, S)
    for b in range(B):
        i, j, h, w = boxes[b].tolist()
        ref = TF.resized_crop(x[b], i, j, h, w, [S, S], antialias=True)
        if flip[b]:
            ref = TF.horizontal_flip(ref)
        torch.testing.assert_close(out[b], ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------
# fidelity: colour
# ---------------------------------------------------------------------------

def test_grayscale_luma_reference():
    x = rand_float((3, 3, 5, 5)).double()
    ref = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    torch.testing.assert_close(A.rgb_to_grayscale(x.float())[:, 0].double(), ref,
                               atol=1e-6, rtol=0)


@pytest.fixture
def tv_luma(monkeypatch):
    """Use torchvision's grey weights so colour ops can be compared at 1e-5."""
    monkeypatch.setattr(A, "LUMA", TV_LUMA)


def test_colour_ops_match_torchvision(tv_luma):
    B = 12
    x = rand_float((B, 3, 16, 16), seed=11)
    x[0] = x[0, :1]                      # a grey image (hue/saturation degenerate case)
    f = 0.6 + 0.8 * torch.rand(B, generator=gen(12))
    hf = -0.1 + 0.2 * torch.rand(B, generator=gen(13))
    ours = {"b": A.adjust_brightness(x, f), "c": A.adjust_contrast(x, f),
            "s": A.adjust_saturation(x, f), "h": A.adjust_hue(x, hf)}
    gray3 = A.random_grayscale(x, torch.ones(B, dtype=torch.bool))
    for b in range(B):
        fb, hb = f[b].item(), hf[b].item()
        torch.testing.assert_close(ours["b"][b], TF.adjust_brightness(x[b], fb), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours["c"][b], TF.adjust_contrast(x[b], fb), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours["s"][b], TF.adjust_saturation(x[b], fb), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours["h"][b], TF.adjust_hue(x[b], hb), atol=1e-4, rtol=0)
        torch.testing.assert_close(gray3[b], TF.rgb_to_grayscale(x[b], num_output_channels=3),
                                   atol=1e-6, rtol=0)


def test_hsv_roundtrip():
    x = rand_float((4, 3, 9, 9), seed=14)
    torch.testing.assert_close(A.hsv_to_rgb(A.rgb_to_hsv(x)), x, atol=1e-5, rtol=0)
    hsv = A.rgb_to_hsv(x)
    assert hsv.min() >= 0 and hsv[:, 0].max() < 1 and hsv[:, 1:].max() <= 1


def _tv_jitter(img, apply, order, factors):
    if not apply:
        return img
    fns = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    for op in order.tolist():
        img = fns[op](img, factors[op].item())
    return img


def test_color_jitter_matches_torchvision_per_sample(tv_luma):
    B = 64
    x = rand_float((B, 3, 12, 12), seed=15)
    params = A.sample_jitter_params(B, gen(16))
    out = A.color_jitter(x, params)
    for b in range(B):
        ref = _tv_jitter(x[b], bool(params["apply"][b]), params["order"][b], params["factors"][b])
        torch.testing.assert_close(out[b], ref, atol=1e-4, rtol=0)
    # not-jittered samples are untouched bit for bit
    keep = ~params["apply"]
    assert keep.any() and torch.equal(out[keep], x[keep])


def test_strong_view_matches_torchvision_pipeline(tv_luma):
    """End to end: per-sample torchvision v2 ops with the same parameters."""
    B, H = 48, 32
    x = rand_u8((B, 3, H, H), seed=17)
    params = A.sample_strong_params(B, H, H, gen(18))
    out = A.apply_strong(x, params, CIFAR_MEAN, CIFAR_STD)
    for b in range(B):
        img = TF.to_dtype(x[b], torch.float32, scale=True)
        i, j, h, w = params["boxes"][b].tolist()
        img = TF.resized_crop(img, i, j, h, w, [H, H], antialias=True)
        if params["flip"][b]:
            img = TF.horizontal_flip(img)
        jit = params["jitter"]
        img = _tv_jitter(img, bool(jit["apply"][b]), jit["order"][b], jit["factors"][b])
        if params["gray"][b]:
            img = TF.rgb_to_grayscale(img, num_output_channels=3)
        ref = TF.normalize(img, list(CIFAR_MEAN), list(CIFAR_STD))
        torch.testing.assert_close(out[b], ref, atol=5e-4, rtol=0)


# ---------------------------------------------------------------------------
# fidelity: weak view
# ---------------------------------------------------------------------------

def test_weak_crop_matches_pad_and_slice():
    B, H, P = 20, 10, 4
    x = rand_u8((B, 3, H, H + 2), seed=19)                     # non-square on purpose
    top = torch.randint(0, 2 * P + 1, (B,), generator=gen(20))
    left = torch.randint(0, 2 * P + 1, (B,), generator=gen(21))
    flip = torch.rand(B, generator=gen(22)) < 0.5
    out = A.padded_crop_flip(x, top, left, flip, P)
    xp = F.pad(x, (P, P, P, P))
    for b in range(B):
        ref = xp[b, :, top[b]:top[b] + H, left[b]:left[b] + H + 2]
        if flip[b]:
            ref = torch.flip(ref, dims=[2])
        assert torch.equal(out[b], ref)
    # extreme offsets reach the zero padding
    corner = A.padded_crop_flip(x, torch.zeros(B, dtype=torch.long),
                                torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.bool), P)
    assert (corner[:, :, :P, :] == 0).all() and torch.equal(corner[:, :, P:, P:], x[:, :, :H - P, :H + 2 - P])


def test_weak_augment_is_crop_then_normalize():
    x = rand_u8((8, 3, 32, 32), seed=23)
    out = A.weak_augment(x, gen(24), CIFAR_MEAN, CIFAR_STD)
    p = A.sample_weak_params(8, gen(24))
    ref = A.normalize(A.padded_crop_flip(x, p["top"], p["left"], p["flip"], 4), CIFAR_MEAN, CIFAR_STD)
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------
# reproducibility
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [A.strong_augment, A.weak_augment])
def test_seed_reproducibility(fn):
    x = rand_u8((16, 3, 32, 32), seed=25)
    a = fn(x, gen(100), CIFAR_MEAN, CIFAR_STD)
    b = fn(x, gen(100), CIFAR_MEAN, CIFAR_STD)
    c = fn(x, gen(101), CIFAR_MEAN, CIFAR_STD)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    g = gen(100)                      # consecutive calls advance the generator
    assert not torch.allclose(fn(x, g, CIFAR_MEAN, CIFAR_STD), fn(x, g, CIFAR_MEAN, CIFAR_STD))


def test_samples_get_independent_params():
    x = rand_u8((1, 3, 32, 32), seed=26).expand(32, 3, 32, 32).contiguous()
    out = A.strong_augment(x, gen(27), CIFAR_MEAN, CIFAR_STD)
    flat = out.flatten(1)
    assert torch.unique(flat, dim=0).shape[0] == 32           # 32 different views


def test_color_jitter_hue_paths_agree():
    """CPU subset path and the GPU-style masked path give identical results."""
    x = rand_float((40, 3, 8, 8), seed=28)
    params = A.sample_jitter_params(40, gen(29))
    a = A.color_jitter(x, params, hue_subset=True)
    b = A.color_jitter(x, params, hue_subset=False)
    assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_never_syncs():
    x = rand_u8((64, 3, 32, 32), seed=30)
    params = A.sample_strong_params(64, 32, 32, gen(31))
    cpu = A.apply_strong(x, params, CIFAR_MEAN, CIFAR_STD)
    to_cuda = lambda p: {k: to_cuda(v) if isinstance(v, dict) else v.cuda() for k, v in p.items()}  # noqa: E731
    gpu = A.apply_strong(x.cuda(), to_cuda(params), CIFAR_MEAN, CIFAR_STD)
    torch.testing.assert_close(gpu.cpu(), cpu, atol=5e-4, rtol=0)
    xc, g = x.cuda(), gen(32, "cuda")
    A.strong_augment(xc, g, CIFAR_MEAN, CIFAR_STD)      # warm-up: cached constants
    A.weak_augment(xc, g, CIFAR_MEAN, CIFAR_STD)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")             # any host sync raises
    try:
        s = A.strong_augment(xc, g, CIFAR_MEAN, CIFAR_STD)
        w = A.weak_augment(xc, g, CIFAR_MEAN, CIFAR_STD)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert s.is_cuda and w.is_cuda and torch.isfinite(s).all()


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiling on CPU is slow)")
def test_compiled_matches_eager_cuda():
    x = rand_u8((32, 3, 32, 32), seed=33).cuda()
    a = A.strong_augment(x, gen(34, "cuda"), CIFAR_MEAN, CIFAR_STD)
    b = A.strong_augment(x, gen(34, "cuda"), CIFAR_MEAN, CIFAR_STD, compiled=True)
    torch.testing.assert_close(a, b, atol=5e-4, rtol=0)
