"""Ring-buffer memories (SPEC §4, §6) against a one-row-at-a-time Python simulation."""
import pytest
import torch

from selcl.memory import KeyQueue, LabelledMemory


class RefRing:
    """Write rows one at a time into slot ptr, ptr ← (ptr+1) mod size."""

    def __init__(self, size):
        self.size, self.slots, self.ptr = size, [None] * size, 0

    def push(self, rows):
        for r in rows:
            if self.size == 0:
                return
            self.slots[self.ptr] = r
            self.ptr = (self.ptr + 1) % self.size

    def filled(self):
        return [r for r in self.slots if r is not None]


def rows(gen, b, d):
    return torch.randn(b, d, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("batches", [[3, 2], [4, 4, 4], [3, 5, 1, 6], [10], [13], [2, 23, 3], [0, 4, 0]])
def test_key_queue_matches_reference(batches):
    gen = torch.Generator().manual_seed(sum(batches))
    q, ref = KeyQueue(10, 4, "cpu"), RefRing(10)
    assert q.keys.shape == (0, 4)
    for b in batches:
        k = rows(gen, b, 4)
        q.enqueue(k)
        ref.push(list(k.float()))
        expected = torch.stack(ref.filled()) if ref.filled() else torch.zeros(0, 4)
        assert q.keys.dtype == torch.float32 and len(q) == len(ref.filled())
        assert torch.equal(q.keys, expected)  # same slots, same order
        assert q.ptr == ref.ptr


def test_key_queue_partial_fill_wrap_and_oversize_contents():
    q = KeyQueue(5, 1)
    q.enqueue(torch.arange(3.0)[:, None])
    assert q.keys.squeeze(1).tolist() == [0, 1, 2] and not q.full
    q.enqueue(torch.arange(3.0, 7.0)[:, None])  # 4 rows, 2 remaining slots → wraps
    assert q.keys.squeeze(1).tolist() == [5, 6, 2, 3, 4] and q.full and q.ptr == 2
    q.enqueue(torch.arange(10.0, 22.0)[:, None])  # 12 rows ≥ size: only the last 5 survive
    assert sorted(q.keys.squeeze(1).tolist()) == [17, 18, 19, 20, 21]
    assert q.ptr == (2 + 12) % 5


def test_key_queue_detaches_and_converts():
    q = KeyQueue(4, 3)
    k = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    q.enqueue(k * 2)
    assert not q.keys.requires_grad and q.keys.dtype == torch.float32
    torch.testing.assert_close(q.keys, (k * 2).detach().float())
    q.enqueue(torch.randn(2, 3).bfloat16())
    assert q.keys.dtype == torch.float32 and q.full
    with pytest.raises(ValueError):
        q.enqueue(torch.randn(2, 5))


def test_zero_size_memory_stays_empty():
    q = KeyQueue(0, 3)
    q.enqueue(torch.randn(4, 3))
    assert q.keys.shape == (0, 3)
    m = LabelledMemory(0, 3, 2)
    m.enqueue(torch.randn(4, 3), torch.rand(4, 2), torch.arange(4))
    assert m.feats.shape == (0, 3) and m.ids.shape == (0,)


def test_key_queue_state_dict_roundtrip():
    gen = torch.Generator().manual_seed(3)
    q = KeyQueue(7, 4)
    q.enqueue(rows(gen, 5, 4))
    q.enqueue(rows(gen, 4, 4))
    state = q.state_dict()
    assert state["keys"].device.type == "cpu"
    q2 = KeyQueue(7, 4)
    q2.load_state_dict(state)
    assert torch.equal(q2.keys, q.keys) and q2.ptr == q.ptr and len(q2) == len(q)
    nxt = rows(gen, 3, 4)
    q.enqueue(nxt)
    q2.enqueue(nxt)
    assert torch.equal(q2.keys, q.keys)
    # the state is a copy: later writes do not change it
    assert not torch.equal(state["keys"], q.keys)
    with pytest.raises(ValueError):
        KeyQueue(8, 4).load_state_dict(state)


def test_labelled_memory_authors_wrap_rule_aligned_fields_and_roundtrip():
    """Slots [ptr, ptr+b) while they fit; otherwise the last b slots and ptr → 0 (the
    authors' rule, SPEC §10.2.3); filled part [0, ptr) until the last slot is written;
    `current` is the latest batch's slots. (Parity with a transcription of the authors'
    queue: tests/test_parity.py.)"""
    gen = torch.Generator().manual_seed(4)
    m = LabelledMemory(10, 3, 4)
    expect = [  # (b, current, ptr, filled)
        (4, (0, 4), 4, 4), (4, (4, 8), 8, 8), (4, (6, 10), 0, 10), (3, (0, 3), 3, 10), (5, (3, 8), 8, 10),
        (2, (8, 10), 10, 10), (1, (9, 10), 0, 10)]
    shadow = torch.full((10,), -1)
    for b, cur, ptr, filled in expect:
        z = rows(gen, b, 3)
        p = torch.softmax(rows(gen, b, 4), 1)
        ids = torch.randint(0, 1000, (b,), generator=gen, dtype=torch.int32)
        m.enqueue(z, p, ids)
        shadow[cur[0]:cur[1]] = ids.long()
        assert (m.current, m.ptr, len(m)) == (cur, ptr, filled)
        assert torch.equal(m.ids, shadow[:filled])
        assert torch.equal(m.feats[cur[0]:cur[1]], z.float()) and torch.equal(m.probs[cur[0]:cur[1]], p.float())
        assert m.current_mask().sum() == b and m.current_mask()[cur[0]:cur[1]].all()
        assert m.ids.dtype == torch.int64 and m.feats.dtype == m.probs.dtype == torch.float32
    m2 = LabelledMemory(10, 3, 4)
    m2.load_state_dict(m.state_dict())
    for name in ("feats", "probs", "ids"):
        assert torch.equal(getattr(m2, name), getattr(m, name))
    assert (m2.ptr, len(m2), m2.current) == (m.ptr, len(m), m.current)
    with pytest.raises(ValueError):
        m.enqueue(rows(gen, 2, 3), torch.rand(3, 4), torch.arange(2))  # mismatched batch sizes
    with pytest.raises(ValueError, match="twice the batch size"):
        m.enqueue(rows(gen, 11, 3), torch.rand(11, 4), torch.arange(11))  # larger than the memory


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_memory_on_device_state_dict_is_cpu(device):
    m = LabelledMemory(5, 3, 2, device)
    for start in (0, 3):
        m.enqueue(torch.randn(3, 3, device=device).bfloat16(), torch.rand(3, 2, device=device),
                  torch.arange(start, start + 3, device=device))
    assert m.feats.device.type == device and m.ids.tolist() == [0, 1, 3, 4, 5]
    state = m.state_dict()
    assert all(state[k].device.type == "cpu" for k in ("feats", "probs", "ids"))
    m2 = LabelledMemory(5, 3, 2, device)
    m2.load_state_dict(state)
    assert torch.equal(m2.feats, m.feats) and m2.ptr == m.ptr == 0


def test_key_queue_fill_random_like_the_authors():
    """MemoryMoCo starts full of uniform [−s, s] keys, s = 1/√(d/3); writing starts at slot 0."""
    q = KeyQueue(6, 12)
    q.fill_random(torch.Generator().manual_seed(0))
    s = 1 / (12 / 3) ** 0.5
    assert q.full and q.ptr == 0 and q.keys.abs().max() <= s and q.keys.std() > 0.1 * s
    k = rows(torch.Generator().manual_seed(1), 2, 12)
    q.enqueue(k)
    assert torch.equal(q.keys[:2], k.float()) and q.full
