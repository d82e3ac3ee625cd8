"""Memories of EMA embeddings (SPEC §4, §6).

* `KeyQueue`       MoCo's FIFO queue of EMA keys: the negatives of the Uns-CL loss
                   (warm-up, §4) and of the Uns-CL term u_i of pre-training (§10.2).
                   10,000 keys on CIFAR.
* `LabelledMemory` the memory of the selective contrastive loss (§6, §10.2): per entry
                   the EMA embedding z [d] of a mixed view, its EMA class probabilities
                   p [C] (for L_SIM) and the dataset index of the entry's example (so
                   that the positive mask against G can be built on the fly).
                   queue_per_class·C·2 entries, written with the authors' wrap rule.

Both are preallocated on the device (no per-step allocation, no torch.cat growth).
The key queue is a ring buffer (MoCo's): writing a batch of b entries is equivalent to writing its rows
one at a time in order: row j lands at slot (ptr + j) mod size, later rows overwrite
earlier ones, and ptr advances by b. Before the first wrap-around the filled part is
slots [0, n); after it, all slots (in slot order, not chronological order — no loss
here depends on the order). Entries are stored detached, embeddings in float32.
"""
from __future__ import annotations

import torch


class _Ring:
    """Ring buffer over several aligned fields, e.g. {"feats": [size, d] float32}."""

    def __init__(self, size: int, fields: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device | str = "cpu"):
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.size = int(size)
        self.device = torch.device(device)
        self._bufs = {name: torch.zeros((self.size, *shape), dtype=dtype, device=self.device)
                      for name, (shape, dtype) in fields.items()}
        self.ptr = 0  # next slot to write
        self.n = 0    # number of filled slots (≤ size)

    def __len__(self) -> int:
        return self.n

    @property
    def full(self) -> bool:
        return self.n == self.size

    def _filled(self, name: str) -> torch.Tensor:
        return self._bufs[name][: self.n]  # slots [0, n) are the filled ones, full or not

    def _write(self, **values: torch.Tensor) -> None:
        sizes = {v.shape[0] for v in values.values()}
        if len(sizes) != 1:
            raise ValueError(f"fields have different batch sizes: { {k: v.shape for k, v in values.items()} }")
        b = sizes.pop()
        if self.size == 0 or b == 0:  # a zero-size memory ("no memory queue" ablation) stays empty
            return
        # Rows that are overwritten within this very batch are never written: keep the
        # last `size` rows, starting at the slot where row (b - size) would have landed.
        keep = min(b, self.size)
        start = (self.ptr + b - keep) % self.size
        first = min(keep, self.size - start)  # rows before the wrap-around
        for name, v in values.items():
            buf = self._bufs[name]
            v = v[b - keep:].detach().to(device=buf.device, dtype=buf.dtype)
            if v.shape[1:] != buf.shape[1:]:
                raise ValueError(f"{name}: expected rows of shape {tuple(buf.shape[1:])}, got {tuple(v.shape[1:])}")
            buf[start:start + first] = v[:first]
            buf[: keep - first] = v[first:]
        self.ptr = (self.ptr + b) % self.size
        self.n = min(self.n + b, self.size)

    def state_dict(self) -> dict:
        """CPU copies of the buffers plus pointer: torch.save-able, device-independent."""
        state = {name: buf.detach().cpu().clone() for name, buf in self._bufs.items()}
        state.update(size=self.size, ptr=self.ptr, n=self.n)
        return state

    def load_state_dict(self, state: dict) -> None:
        if int(state["size"]) != self.size:
            raise ValueError(f"state has size {state['size']}, this memory has size {self.size}")
        for name, buf in self._bufs.items():
            if tuple(state[name].shape) != tuple(buf.shape):
                raise ValueError(f"{name}: state shape {tuple(state[name].shape)} != {tuple(buf.shape)}")
            buf.copy_(state[name].to(device=buf.device, dtype=buf.dtype))
        self.ptr, self.n = int(state["ptr"]), int(state["n"])


class KeyQueue(_Ring):
    """MoCo FIFO queue of EMA keys (SPEC §4): `enqueue(k [b,d])`, `.keys` → [n,d] float32."""

    def __init__(self, size: int, dim: int, device: torch.device | str = "cpu"):
        super().__init__(size, {"keys": ((dim,), torch.float32)}, device)
        self.dim = dim

    @property
    def keys(self) -> torch.Tensor:
        """[n, d] float32, the filled part (n = 0 before the first enqueue)."""
        return self._filled("keys")

    def enqueue(self, keys: torch.Tensor) -> None:
        """keys [b, d] (any float dtype; stored detached as float32). b may exceed size."""
        self._write(keys=keys)

    def fill_random(self, generator: torch.Generator) -> None:
        """Start full of random negatives, as the authors' MemoryMoCo: every entry uniform in
        [−s, s], s = 1/√(d/3) (not unit vectors); the first batches overwrite slot 0 onward."""
        s = 1.0 / (self.dim / 3) ** 0.5
        u = torch.rand(self.size, self.dim, generator=generator, device=generator.device)
        self._bufs["keys"].copy_((2 * s * u - s).to(self._bufs["keys"]))
        self.ptr, self.n = 0, self.size


class LabelledMemory:
    """EMA memory of the selective contrastive loss (SPEC §6, §10.2.3).

    Per entry: z [d] (EMA embedding of a *mixed* view), p [C] (its EMA softmax class
    probabilities, for L_SIM) and the int64 dataset index of its dominant example.

    Written with the authors' rule, not a ring: a batch of b entries goes to slots
    [ptr, ptr + b) and ptr advances by b; when ptr + b would pass the end, the batch
    goes to the *last* b slots instead and ptr restarts at 0. The filled part is slots
    [0, ptr) until the last slot has been written, then all slots. `current` is the slot
    range of the latest batch (the loss reads the memory after this step's enqueue, so
    the current batch is in it and its entries get the masks of §10.2.4).
    """

    def __init__(self, size: int, dim: int, num_classes: int, device: torch.device | str = "cpu"):
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.size, self.dim, self.num_classes = int(size), dim, num_classes
        self.device = torch.device(device)
        self._feats = torch.zeros(self.size, dim, dtype=torch.float32, device=self.device)
        self._probs = torch.zeros(self.size, num_classes, dtype=torch.float32, device=self.device)
        self._ids = torch.full((self.size,), -1, dtype=torch.int64, device=self.device)
        self.ptr = 0          # next slot to write
        self.n = 0            # filled slots: ptr until the last slot is written, then size
        self.current = (0, 0)  # slot range [start, stop) of the latest batch

    def __len__(self) -> int:
        return self.n

    @property
    def full(self) -> bool:
        return self.n == self.size

    @property
    def feats(self) -> torch.Tensor:
        """[n, d] float32 EMA embeddings z."""
        return self._feats[: self.n]

    @property
    def probs(self) -> torch.Tensor:
        """[n, C] float32 EMA class probabilities p."""
        return self._probs[: self.n]

    @property
    def ids(self) -> torch.Tensor:
        """[n] int64 dataset index of each entry's example."""
        return self._ids[: self.n]

    def enqueue(self, z: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor) -> None:
        """z [b, d], probs [b, C], ids [b] (dataset indices); stored detached. b ≤ size."""
        b = ids.shape[0]
        if z.shape[0] != b or probs.shape[0] != b:
            raise ValueError(f"z, probs and ids have different batch sizes: {z.shape[0]}, {probs.shape[0]}, {b}")
        if self.size == 0 or b == 0:          # "no memory queue" ablation: stays empty
            return
        if b > self.size:
            raise ValueError(f"a batch of {b} entries does not fit a memory of {self.size} "
                             f"(queue_per_class·C·2 must be at least twice the batch size)")
        if self.ptr + b > self.size:          # the authors' wrap: the last b slots, ptr → 0
            start, self.ptr = self.size - b, 0
        else:
            start = self.ptr
            self.ptr += b
        self._feats[start:start + b] = z.detach().to(self._feats)
        self._probs[start:start + b] = probs.detach().to(self._probs)
        self._ids[start:start + b] = ids.detach().to(self._ids)
        self.n = self.size if (start + b == self.size or self.n == self.size) else self.ptr
        self.current = (start, start + b)

    def current_mask(self) -> torch.Tensor:
        """bool [n]: the slots of the latest batch."""
        mask = torch.zeros(self.n, dtype=torch.bool, device=self.device)
        mask[self.current[0]:self.current[1]] = True
        return mask

    def state_dict(self) -> dict:
        return {"feats": self._feats.detach().cpu().clone(), "probs": self._probs.detach().cpu().clone(),
                "ids": self._ids.detach().cpu().clone(), "size": self.size, "ptr": self.ptr, "n": self.n,
                "current": list(self.current)}

    def load_state_dict(self, state: dict) -> None:
        if int(state["size"]) != self.size:
            raise ValueError(f"state has size {state['size']}, this memory has size {self.size}")
        for name, buf in (("feats", self._feats), ("probs", self._probs), ("ids", self._ids)):
            if tuple(state[name].shape) != tuple(buf.shape):
                raise ValueError(f"{name}: state shape {tuple(state[name].shape)} != {tuple(buf.shape)}")
            buf.copy_(state[name].to(device=buf.device, dtype=buf.dtype))
        self.ptr, self.n = int(state["ptr"]), int(state["n"])
        self.current = tuple(int(v) for v in state.get("current", (0, 0)))
