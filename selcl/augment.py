"""Batched image augmentation on the data's device (SPEC §3).

Why own code (not kornia, not a per-sample torchvision loop):
  * A whole batch is augmented by tensor ops on the device where the uint8 data
    lives (GPU in real runs): no DataLoader workers, no PIL, no host→device copy
    of float images. On CUDA nothing here synchronises with the host (no .item(),
    no boolean indexing; checked with torch.cuda.set_sync_debug_mode("error")).
  * Fidelity: we reproduce torchvision's *sampling* exactly (RandomResizedCrop's
    10-tries-then-centre-crop rule, ColorJitter's factor ranges and per-image
    random op order, p = 0.8 / 0.2 / 0.5) and its colour maths (adjust_brightness /
    contrast / saturation / hue, clamping after each op), and the tests compare
    against torchvision.transforms.v2.functional op by op. kornia is not
    installed; it would add a dependency whose samplers and kernels we would have
    to check against torchvision the same way, with less control over them.
  * Speed (bench/augment.py, B = 128, 32 px, one strong view; H200 machine):
    CPU 1 thread: own 13 ms, per-sample torchvision v2 88 ms, PIL (the authors'
    path) 63 ms; CUDA eager ≈ 4-7 ms per call (launch-bound: ~300 small kernels,
    so 4 views in one call of 512 cost 5 ms), strong_augment(compiled=True)
    1.7 ms per call, 1.1 ms for 4 views in one call.
All randomness comes from the `torch.Generator` passed in (on the data's device):
same generator state ⇒ identical output.

Deliberate differences from the authors' PIL pipeline (all small):
  * float maths throughout (PIL rounds to uint8 after every op);
  * no antialiasing when a crop is *downsampled*. This never happens when the
    output size equals the input size (CIFAR: 32 → 32, every crop is upsampled,
    where bilinear with and without antialias agree); it only matters when
    `size` is smaller than the image (e.g. WebVision crops larger than 224 px);
  * grey = 0.299 R + 0.587 G + 0.114 B (ITU-R 601-2, what PIL uses;
    torchvision's tensor kernels use 0.2989 for R).

Shapes: input uint8 [B, 3, H, W] (NCHW; float input in [0, 1] is accepted too);
output float32 [B, 3, S, S], normalised with the dataset mean / std.

Crops (`crop`, SPEC §10.4): CIFAR feeds the whole stored image to the network
(`crop=None`: strong views RandomResizedCrop back to H×W, weak views RandomCrop(H×W,
padding 4), test images as they are). WebVision stores 256 px images and feeds
224 px crops, as the authors' torchvision pipelines: strong views
RandomResizedCrop(crop, scale), weak views RandomCrop(crop) without padding, test /
selection / k-NN images CenterCrop(crop) (`eval_view`).
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
import torch.nn.functional as F

from .device import run_compiled

LUMA = (0.299, 0.587, 0.114)   # ITU-R 601-2 luma weights (PIL's convert("L"))

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _const_cached(values: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _const(values: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A small constant tensor, built once per device: torch.tensor(..., device=cuda)
    is a blocking host→device copy, which would stall the GPU pipeline every call.
    Under torch.compile it becomes a graph constant instead (no cache needed)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    return _const_cached(values, device, dtype)


def _stats(v, x: torch.Tensor) -> torch.Tensor:
    """mean / std (3 numbers, or a tensor) → float32 [1, 3, 1, 1] on x's device."""
    if isinstance(v, torch.Tensor):
        return v.to(device=x.device, dtype=torch.float32).reshape(1, -1, 1, 1)
    return _const(tuple(float(a) for a in v), x.device, torch.float32).reshape(1, -1, 1, 1)


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] → float32 [0, 1]; float input is taken as already in [0, 1]."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x/255 − mean) / std per channel. x uint8 [B,3,H,W] (or float in [0,1]) → float32."""
    return (to_float(x) - _stats(mean, x)) / _stats(std, x)      # out of place: float x is not modified


def _rand(shape, generator, device, dtype=torch.float32) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)


def _pair(size, H: int, W: int) -> tuple[int, int]:
    if size is None:
        return H, W
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


# ---------------------------------------------------------------------------
# RandomResizedCrop + horizontal flip
# ---------------------------------------------------------------------------


def sample_resized_crop_params(B: int, H: int, W: int, generator: torch.Generator,
                               scale: tuple[float, float] = (0.08, 1.0),
                               ratio: tuple[float, float] = (3 / 4, 4 / 3),
                               tries: int = 10, device=None) -> torch.Tensor:
    """Per-sample crop boxes with torchvision's RandomResizedCrop.get_params rule.

    For each sample, up to `tries` candidates: area fraction s ~ U[scale],
    log aspect ratio ~ U[log ratio], w = round(√(s·H·W·r)), h = round(√(s·H·W/r));
    the first candidate with 0 < w ≤ W and 0 < h ≤ H wins, its corner uniform
    over the valid positions. If none fits: a centre crop with the ratio clamped to
    `ratio`. Vectorised: all candidates are drawn at once, the first valid one is
    picked with argmax. Returns int64 [B, 4] = (top i, left j, height h, width w).
    """
    device = device if device is not None else generator.device
    area = float(H * W)
    u = _rand((B, tries, 2), generator, device, torch.float64)   # float64: round() like Python
    log_r0, log_r1 = math.log(ratio[0]), math.log(ratio[1])
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    aspect = torch.exp(log_r0 + (log_r1 - log_r0) * u[..., 1])
    w = torch.round(torch.sqrt(target_area * aspect))            # round half to even, as Python
    h = torch.round(torch.sqrt(target_area / aspect))
    valid = (w > 0) & (w <= W) & (h > 0) & (h <= H)              # [B, tries]
    first = valid.to(torch.uint8).argmax(dim=1, keepdim=True)    # first valid try (0 if none)
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)
    # fallback: centre crop, aspect ratio clamped to [ratio]
    in_ratio = W / H
    if in_ratio < min(ratio):
        fw, fh = W, int(round(W / min(ratio)))
    elif in_ratio > max(ratio):
        fw, fh = int(round(H * max(ratio))), H
    else:
        fw, fh = W, H
    ok = valid.any(dim=1)
    w = torch.where(ok, w, torch.full_like(w, fw))
    h = torch.where(ok, h, torch.full_like(h, fh))
    uij = _rand((B, 2), generator, device, torch.float64)
    i = torch.floor(uij[:, 0] * (H - h + 1))                     # randint(0, H − h + 1)
    j = torch.floor(uij[:, 1] * (W - w + 1))
    i = torch.where(ok, i, torch.full_like(i, (H - fh) // 2))
    j = torch.where(ok, j, torch.full_like(j, (W - fw) // 2))
    return torch.stack([i, j, h, w], dim=1).long()


def resized_crop_flip(x: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor,
                      size: int | tuple[int, int]) -> torch.Tensor:
    """Crop box (i, j, h, w) of each image, bilinear resize to `size`, optionally
    mirror — as one per-sample affine resample.

    x float [B, C, H, W]; boxes int [B, 4]; flip bool [B] → float [B, C, Sh, Sw].
    With align_corners=False, output pixel centre u ∈ (−1, 1) maps to input
    x_in = a·u + b with a = ±w/W, b = (2j + w)/W − 1 (same for rows). The grid is
    clamped to the centres of the box's border pixels, which is exactly what
    crop-then-resize does at the crop edge (torch's bilinear clamps the source
    index into the cropped image), so this equals torchvision's
    resized_crop (upsampling) up to float rounding.
    """
    B, C, H, W = x.shape
    Sh, Sw = _pair(size, H, W)
    b = boxes.to(torch.float32)
    i, j, h, w = b.unbind(1)
    sx = torch.where(flip, -w / W, w / W)                         # flip folded into the affine
    tx = (2 * j + w) / W - 1
    sy = h / H
    ty = (2 * i + h) / H - 1
    zero = torch.zeros_like(sx)
    theta = torch.stack([torch.stack([sx, zero, tx], 1),
                         torch.stack([zero, sy, ty], 1)], 1)      # [B, 2, 3]
    grid = F.affine_grid(theta, [B, C, Sh, Sw], align_corners=False)  # [B, Sh, Sw, 2] (x, y)
    lo = torch.stack([(2 * j + 1) / W - 1, (2 * i + 1) / H - 1], 1).view(B, 1, 1, 2)
    hi = torch.stack([(2 * (j + w) - 1) / W - 1, (2 * (i + h) - 1) / H - 1], 1).view(B, 1, 1, 2)
    grid = torch.clamp(grid, lo, hi)                              # stay inside the crop
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


# ---------------------------------------------------------------------------
# Colour: grayscale, ColorJitter, hue via HSV
# ---------------------------------------------------------------------------


def rgb_to_grayscale(x: torch.Tensor) -> torch.Tensor:
    """float [B, 3, H, W] → [B, 1, H, W], L = 0.299 R + 0.587 G + 0.114 B (module LUMA)."""
    r, g, b = x.unbind(1)
    wr, wg, wb = LUMA
    return (r * wr + g * wg + b * wb).unsqueeze(1)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """clamp(f·x + (1−f)·other, 0, 1) with per-sample f [B] (torchvision's _blend)."""
    f = f.view(-1, 1, 1, 1)
    return (x * f + other * (1 - f)).clamp_(0.0, 1.0)


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, torch.zeros_like(x), f)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Blend with the per-image mean of the grayscale image."""
    return _blend(x, rgb_to_grayscale(x).mean(dim=(1, 2, 3), keepdim=True), f)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, rgb_to_grayscale(x), f)


_TINY = torch.finfo(torch.float32).tiny


def _hsv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float RGB [B, 3, H, W] in [0, 1] → h, s, v each [B, H, W], h in [0, 1).

    torchvision's / PIL's formulas, written with float masks and clamp_min instead
    of torch.where / bool masks (those are not vectorised on CPU: ~10× slower).
    Grey pixels (max = min) get s = h = 0 without a 0/0.
    """
    # contiguous planes: elementwise ops on strided x[:, c] views are ~4× slower on CPU
    r, g, b = x.transpose(0, 1).contiguous().unbind(0)
    v = torch.maximum(torch.maximum(r, g), b)
    cr = v - torch.minimum(torch.minimum(r, g), b)
    s = cr / v.clamp_min(_TINY)                    # v = 0 ⇒ cr = 0 ⇒ s = 0
    crd = cr.clamp_min(_TINY)                      # cr = 0 ⇒ rc = gc = bc = 0
    rc, gc, bc = (v - r) / crd, (v - g) / crd, (v - b) / crd
    is_r = 1.0 - torch.sign(rc)                    # max is R   (rc ≥ 0, = 0 iff v = r)
    is_g = (1.0 - is_r) * (1.0 - torch.sign(gc))   # max is G (and not R)
    is_b = (1.0 - is_r) * torch.sign(gc)           # otherwise B
    h = is_r * (bc - gc) + is_g * (2.0 + rc - bc) + is_b * (4.0 + gc - rc)
    h = h * (1.0 / 6.0) + 1.0                      # in [5/6, 2)
    return h - torch.floor(h), s, v                # fmod(h, 1) (exact here)


_HUE_C = (3.0, 2.0, 4.0)     # w_c(6h) = clamp(sgn·|6h − c| + off, 0, 1) for R, G, B
_HUE_SGN = (-1.0, 1.0, 1.0)
_HUE_OFF = (2.0, -1.0, -1.0)


def _rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """h in [0, 1], s, v [B, H, W] → RGB [B, 3, H, W].

    Closed form of the six-sector v/p/q/t table: channel = v − v·s·w(6h) with
    w_R = clamp(2 − |6h − 3|, 0, 1), w_G = clamp(|6h − 2| − 1, 0, 1),
    w_B = clamp(|6h − 4| − 1, 0, 1). Equal to torchvision's selection up to float
    rounding, but purely elementwise (no gather, no integer sector index), and
    broadcast over a [1, 3, 1, 1] constant instead of stacking three planes
    (torch.stack along dim 1 is a slow copy on CPU).
    """
    def const(c):
        return _const(c, h.device, h.dtype).view(1, 3, 1, 1)
    h6 = (h * 6.0).unsqueeze(1)                                      # [B, 1, H, W]
    w = ((h6 - const(_HUE_C)).abs_().mul_(const(_HUE_SGN)).add_(const(_HUE_OFF))).clamp_(0.0, 1.0)
    v = v.unsqueeze(1)
    return v - (v * s.unsqueeze(1)) * w                              # [B, 3, H, W]


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """float RGB [B, 3, H, W] in [0, 1] → HSV [B, 3, H, W], h in [0, 1)."""
    return torch.stack(_hsv(x), dim=1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """HSV [B, 3, H, W] → RGB [B, 3, H, W]."""
    return _rgb(*x.unbind(1))


def adjust_hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Rotate hue by f [B] (fraction of a turn, in [−0.5, 0.5]): RGB → HSV, h ← (h + f) mod 1, → RGB."""
    h, s, v = _hsv(x)
    h = h + f.view(-1, 1, 1)
    return _rgb(h - torch.floor(h), s, v)          # (h + f) mod 1


def sample_jitter_params(B: int, generator: torch.Generator, brightness: float = 0.4,
                         contrast: float = 0.4, saturation: float = 0.4, hue: float = 0.1,
                         p: float = 0.8, device=None) -> dict[str, torch.Tensor]:
    """RandomApply(ColorJitter(b, c, s, h), p) parameters per sample, as torchvision.

    Returns apply bool [B] (P = p); order int64 [B, 4], a uniform random permutation
    of the ops 0 brightness, 1 contrast, 2 saturation, 3 hue; factors float32 [B, 4]:
    brightness/contrast/saturation ~ U[max(0, 1−v), 1+v], hue ~ U[−h, h].
    """
    device = device if device is not None else generator.device
    apply = _rand(B, generator, device) < p
    order = torch.argsort(_rand((B, 4), generator, device), dim=1)
    lo = _const((max(0.0, 1 - brightness), max(0.0, 1 - contrast),
                 max(0.0, 1 - saturation), -hue), torch.device(device), torch.float32)
    hi = _const((1 + brightness, 1 + contrast, 1 + saturation, hue), torch.device(device),
                torch.float32)
    factors = lo + (hi - lo) * _rand((B, 4), generator, device)
    return {"apply": apply, "order": order, "factors": factors}


def color_jitter(x: torch.Tensor, params: dict[str, torch.Tensor],
                 hue_subset: bool | None = None) -> torch.Tensor:
    """Apply sampled ColorJitter params to float [B, 3, H, W] in [0, 1].

    Vectorised over the per-sample op order: in each of the 4 slots every sample
    does one op. Brightness, contrast and saturation are all blends
    clamp(f·x + (1−f)·other) with other = 0 / mean grey / grey, so one blend with a
    per-sample `other` and f covers them (f = 1 ⇒ exact identity for samples doing
    hue in this slot or not jittered).
    Hue (the expensive op, RGB→HSV→RGB): on CUDA it is computed for the whole
    batch and selected with lerp(x, hue(x), w), w ∈ {0, 1} (exact; no boolean
    indexing, which would sync the GPU). On CPU (`hue_subset`, default: CPU) only
    the ≈ B/5 samples doing hue in this slot are converted — 4-5× less hue work;
    both paths give identical results.
    """
    apply, order, factors = params["apply"], params["order"], params["factors"]
    B = x.shape[0]
    if hue_subset is None:
        hue_subset = x.device.type == "cpu"
    ops = torch.arange(4, device=x.device)
    for slot in range(4):
        op = order[:, slot]
        w = ((op.view(B, 1) == ops) & apply.view(B, 1)).to(x.dtype)  # [B, 4] op done in this slot
        w_con, w_sat, w_hue = (w[:, k].view(B, 1, 1, 1) for k in (1, 2, 3))
        gray = rgb_to_grayscale(x)                                  # [B, 1, H, W]
        mean = gray.mean(dim=(1, 2, 3), keepdim=True)               # contrast target
        other = gray * w_sat + mean * w_con                         # 0 for brightness
        f = torch.where(w[:, :3].sum(1) > 0, factors.gather(1, op.view(B, 1)).squeeze(1), 1.0)
        x = _blend(x, other, f)
        if hue_subset:
            idx = torch.nonzero(w[:, 3]).squeeze(1)
            if idx.numel():
                x = x.index_copy(0, idx, adjust_hue(x.index_select(0, idx), factors[idx, 3]))
        else:
            x = torch.lerp(x, adjust_hue(x, factors[:, 3]), w_hue)
    return x


def random_grayscale(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Replace images where mask [B] is True by their grey image replicated to 3 channels."""
    m = mask.to(x.dtype).view(-1, 1, 1, 1)
    return torch.lerp(x, rgb_to_grayscale(x).expand_as(x), m)      # exact select, m ∈ {0, 1}


# ---------------------------------------------------------------------------
# The two pipelines of SPEC §3
# ---------------------------------------------------------------------------


def sample_strong_params(B: int, H: int, W: int, generator: torch.Generator, *,
                         scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3),
                         jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1),
                         p_jitter: float = 0.8, p_gray: float = 0.2, p_flip: float = 0.5,
                         device=None) -> dict[str, torch.Tensor]:
    """All random parameters of one strong view per sample, drawn in a fixed order
    (boxes, flip, jitter, grey): boxes int64 [B, 4]; flip, gray bool [B];
    jitter = sample_jitter_params(...)."""
    device = device if device is not None else generator.device
    boxes = sample_resized_crop_params(B, H, W, generator, scale, ratio, device=device)
    flip = _rand(B, generator, device) < p_flip
    jit = sample_jitter_params(B, generator, *jitter, p=p_jitter, device=device)
    gray = _rand(B, generator, device) < p_gray
    return {"boxes": boxes, "flip": flip, "jitter": jit, "gray": gray}


def apply_strong(x: torch.Tensor, params: dict, mean: Sequence[float], std: Sequence[float],
                 size: int | tuple[int, int] | None = None,
                 hue_subset: bool | None = None) -> torch.Tensor:
    """Deterministic part of the strong view: crop+resize+flip → jitter → grey → normalise.

    x uint8 [B, 3, H, W] (or float in [0, 1]) → float32 [B, 3, S, S]."""
    H, W = x.shape[-2:]
    img = resized_crop_flip(to_float(x), params["boxes"], params["flip"], _pair(size, H, W))
    img = color_jitter(img, params["jitter"], hue_subset)
    img = random_grayscale(img, params["gray"])
    return img.sub_(_stats(mean, x)).div_(_stats(std, x))


@functools.lru_cache(maxsize=1)
def _apply_strong_compiled():
    """apply_strong under torch.compile (masked hue path: no data-dependent shapes).

    Eager mode launches ~300 small kernels per call, so on a GPU a 32-px batch is
    bound by Python/launch overhead (~4 ms per call whatever the batch size);
    inductor fuses them into a handful of kernels. Compiles once per shape
    (tens of seconds), so it pays off for long runs only.
    """
    # dynamic=False: 2B rows in the warm-up and pre-training, B in fine-tuning; by default
    # the second size would recompile as a slower dynamic-shape graph (see device.compiled).
    return torch.compile(functools.partial(apply_strong, hue_subset=False), dynamic=False)


def strong_augment(x: torch.Tensor, generator: torch.Generator, mean: Sequence[float],
                   std: Sequence[float], size: int | tuple[int, int] | None = None,
                   compiled: bool = False, **kwargs) -> torch.Tensor:
    """Pre-training view (SPEC §3): RandomResizedCrop(size, scale 0.08–1, ratio 3/4–4/3)
    → flip p=0.5 → ColorJitter(0.4, 0.4, 0.4, 0.1) with p=0.8 → grayscale p=0.2
    → normalise. No blur.

    x uint8 [B, 3, H, W] on any device; generator on the same device; size defaults
    to (H, W); kwargs (scale, ratio, jitter, p_jitter, p_gray, p_flip) override the
    SPEC values; compiled: run the deterministic part under torch.compile (same
    result up to float rounding). → float32 [B, 3, S, S], every sample with its own
    parameters. Views are independent per sample, so several views of a batch are
    best made in one call on the concatenated batch (one launch sequence, not k).
    """
    B, _, H, W = x.shape
    params = sample_strong_params(B, H, W, generator, device=x.device, **kwargs)
    if compiled:   # where compilation fails, eagerly: the same result (device.run_compiled)
        return run_compiled(x.device.type, _apply_strong_compiled(), apply_strong, x, params, mean, std, size)
    return apply_strong(x, params, mean, std, size)


def padded_crop_flip(x: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                     flip: torch.Tensor, padding: int = 4,
                     size: int | tuple[int, int] | None = None) -> torch.Tensor:
    """Zero-pad by `padding`, take the Sh×Sw window (`size`, default H×W) at (top, left)
    of each image, mirror where flip. x [B, C, H, W] (any dtype); top/left int [B] in
    [0, H + 2·padding − Sh] / [0, W + 2·padding − Sw].

    Vectorised as two gathers with per-sample row / column indices; the flip is
    just reversed column indices, so it costs nothing extra.
    """
    B, C, H, W = x.shape
    Sh, Sw = _pair(size, H, W)
    xp = F.pad(x, (padding, padding, padding, padding)) if padding else x   # zeros
    ar_h = torch.arange(Sh, device=x.device)
    ar_w = torch.arange(Sw, device=x.device)
    rows = top.view(B, 1) + ar_h                                    # [B, Sh]
    cols = left.view(B, 1) + torch.where(flip.view(B, 1), Sw - 1 - ar_w, ar_w)   # [B, Sw]
    out = xp.gather(2, rows.view(B, 1, Sh, 1).expand(B, C, Sh, xp.shape[3]))
    return out.gather(3, cols.view(B, 1, 1, Sw).expand(B, C, Sh, Sw))


def sample_weak_params(B: int, generator: torch.Generator, padding: int = 4,
                       p_flip: float = 0.5, device=None, *, image_hw: tuple[int, int] | None = None,
                       size: int | tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """RandomCrop offsets as torchvision's RandomCrop.get_params on the padded image:
    top ~ randint(0, H + 2·padding − Sh + 1), left ~ randint(0, W + 2·padding − Sw + 1)
    — randint(0, 2·padding + 1) when the window is the image size (size None, the
    CIFAR case; image_hw is then not needed) — and flip ~ Bernoulli(p_flip); each [B]."""
    device = device if device is not None else generator.device
    if size is None:
        n_h = n_w = 2 * padding + 1
    else:
        H, W = image_hw
        Sh, Sw = _pair(size, H, W)
        n_h, n_w = H + 2 * padding - Sh + 1, W + 2 * padding - Sw + 1
        if n_h < 1 or n_w < 1:
            raise ValueError(f"crop {Sh}×{Sw} is larger than the padded {H}×{W} image")
    if n_h == n_w:
        offs = torch.randint(0, n_h, (B, 2), generator=generator, device=device)
    else:
        offs = torch.stack([torch.randint(0, n, (B,), generator=generator, device=device)
                            for n in (n_h, n_w)], 1)
    flip = _rand(B, generator, device) < p_flip
    return {"top": offs[:, 0], "left": offs[:, 1], "flip": flip}


def weak_augment(x: torch.Tensor, generator: torch.Generator, mean: Sequence[float],
                 std: Sequence[float], padding: int | None = None, p_flip: float = 0.5,
                 crop: int | None = None) -> torch.Tensor:
    """Fine-tuning view (SPEC §3, §10.4): RandomCrop → flip p=0.5 → normalise.

    crop None (CIFAR): RandomCrop(H×W, padding 4, zero fill) → float32 [B, 3, H, W].
    crop = S (WebVision): RandomCrop(S) without padding → float32 [B, 3, S, S].
    `padding` overrides those defaults (4 / 0). The crop is done on uint8 (4× less
    memory traffic) before the float conversion.
    """
    if padding is None:
        padding = 4 if crop is None else 0
    p = sample_weak_params(x.shape[0], generator, padding, p_flip, device=x.device,
                           image_hw=tuple(x.shape[-2:]), size=crop)
    return normalize(padded_crop_flip(x, p["top"], p["left"], p["flip"], padding, crop), mean, std)


# ---------------------------------------------------------------------------
# Test / selection / k-NN inputs
# ---------------------------------------------------------------------------


def center_crop(x: torch.Tensor, size: int | tuple[int, int] | None) -> torch.Tensor:
    """The central Sh×Sw window of [B, C, H, W] (a view, any dtype), offsets as
    torchvision's CenterCrop: top = round((H − Sh) / 2), left = round((W − Sw) / 2)
    (Python round: half to even). size None: x itself."""
    if size is None:
        return x
    H, W = x.shape[-2:]
    Sh, Sw = _pair(size, H, W)
    if Sh > H or Sw > W:
        raise ValueError(f"centre crop {Sh}×{Sw} is larger than the {H}×{W} image")
    top, left = int(round((H - Sh) / 2.0)), int(round((W - Sw) / 2.0))
    return x[..., top:top + Sh, left:left + Sw]


def eval_view(x: torch.Tensor, mean: Sequence[float], std: Sequence[float],
              crop: int | None = None) -> torch.Tensor:
    """Un-augmented network input (test, selection, k-NN, bootstrapping targets):
    CenterCrop(crop) (crop None: the whole image) → normalise. uint8 → float32."""
    return normalize(center_crop(x, crop), mean, std)
