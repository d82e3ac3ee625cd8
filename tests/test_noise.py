"""Noisy-label generation (SPEC §1): counts, maps, frequencies, determinism, files, errors."""
import hashlib

import numpy as np
import pytest
import torch

from selcl.noise import (CIFAR100_FINE_TO_COARSE, GENERATORS, NOISE_KINDS, NoiseError, asymmetric_map,
                         floor_count, make_noisy_labels, realised_noise_rate, resolve_generator,
                         symmetric_noise_indices, transition_matrix)


def _clean(n, c):
    return np.arange(n, dtype=np.int64) % c


def _sha(a):
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()


# ----------------------------------------------------------------------------- sym

# ⌊r·N⌋ written out by hand (100·0.29 is 28.999999999999996 in floating point: still 29)
@pytest.mark.parametrize("n,r,expected", [(1000, 0.4, 400), (100, 0.29, 29), (37, 0.5, 18), (10, 0.0, 0),
                                          (10, 1.0, 10), (999, 0.8, 799)])
def test_sym_redraws_exactly_floor_rN(n, r, expected):
    assert floor_count(r, n) == expected
    idx = symmetric_noise_indices(n, r, seed=3)
    assert len(idx) == expected and len(np.unique(idx)) == expected
    y = _clean(n, 10)
    # excluding the true class, every chosen example changes and nothing else does
    noisy = make_noisy_labels(y, 10, "sym", r, seed=3, include_true_class=False)
    assert np.array_equal(np.flatnonzero(noisy != y), np.sort(idx))
    assert realised_noise_rate(y, noisy) == expected / n
    # including it, changes happen only inside the chosen set
    noisy_in = make_noisy_labels(y, 10, "sym", r, seed=3)
    assert set(np.flatnonzero(noisy_in != y)) <= set(idx.tolist())


def test_sym_include_true_class_statistics():
    n, C, r = 200_000, 10, 0.6
    y = _clean(n, C)
    noisy = make_noisy_labels(y, C, "sym", r, seed=0)
    idx = symmetric_noise_indices(n, r, 0)
    # realised rate ≈ r·(C−1)/C (binomial sd ≈ 0.001)
    assert abs(realised_noise_rate(y, noisy) - r * (C - 1) / C) < 0.005
    # re-drawn labels are uniform over all C classes, true class included
    counts = np.bincount(noisy[idx], minlength=C) / len(idx)
    assert np.all(np.abs(counts - 1 / C) < 0.006)
    assert abs(np.mean(noisy[idx] == y[idx]) - 1 / C) < 0.005


def test_sym_exclude_true_class_uniform_over_others():
    n, C = 100_000, 5
    y = _clean(n, C)
    noisy = make_noisy_labels(y, C, "sym", 1.0, seed=1, include_true_class=False)
    assert np.all(noisy != y)
    for c in range(C):
        freq = np.bincount(noisy[y == c], minlength=C) / np.sum(y == c)
        assert freq[c] == 0
        others = np.delete(freq, c)
        assert np.all(np.abs(others - 1 / (C - 1)) < 0.015)


def test_sym_pinned_hash_and_determinism():
    y = _clean(1000, 10)
    a = make_noisy_labels(y, 10, "sym", 0.4, seed=42)
    b = make_noisy_labels(y, 10, "sym", 0.4, seed=42)
    assert a.dtype == np.int64 and np.array_equal(a, b)
    # pinned: a change of RNG usage (order of draws, generator, dtype) changes this
    assert _sha(a) == "02d8570f69dbdec7df59cfe5bdfe0589c50bfc0c48c961a6ca36da3cab873b23"
    assert not np.array_equal(a, make_noisy_labels(y, 10, "sym", 0.4, seed=43))


def test_asym_pinned_hash():
    y = _clean(1000, 10)
    a = make_noisy_labels(y, 10, "asym", 0.4, seed=42, dataset="cifar10")
    assert _sha(a) == "1c4a85dbe0445cad6ed166809cdce7fe8a4d9b0a22be62281df49dca10669999"


# ----------------------------------------------------------------------------- asym maps

def test_cifar10_map_pairs():
    t = asymmetric_map("cifar10", 10)
    expected = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}
    for c in range(10):
        assert t[c] == expected.get(c, c)


def test_cifar100_superclasses_have_five_fine_classes():
    coarse = np.asarray(CIFAR100_FINE_TO_COARSE)
    assert coarse.shape == (100,)
    assert np.array_equal(np.bincount(coarse, minlength=20), np.full(20, 5))
    assert sorted(np.flatnonzero(coarse == 0).tolist()) == [4, 30, 55, 72, 95]


# The CIFAR-100 superclass listing (cs.toronto.edu/~kriz/cifar.html); fine ids are the
# alphabetical ranks of the fine names, coarse ids those of the superclass names.
_SUPER = {
    "aquatic_mammals": "beaver dolphin otter seal whale",
    "fish": "aquarium_fish flatfish ray shark trout",
    "flowers": "orchid poppy rose sunflower tulip",
    "food_containers": "bottle bowl can cup plate",
    "fruit_and_vegetables": "apple mushroom orange pear sweet_pepper",
    "household_electrical_devices": "clock keyboard lamp telephone television",
    "household_furniture": "bed chair couch table wardrobe",
    "insects": "bee beetle butterfly caterpillar cockroach",
    "large_carnivores": "bear leopard lion tiger wolf",
    "large_man-made_outdoor_things": "bridge castle house road skyscraper",
    "large_natural_outdoor_scenes": "cloud forest mountain plain sea",
    "large_omnivores_and_herbivores": "camel cattle chimpanzee elephant kangaroo",
    "medium_mammals": "fox porcupine possum raccoon skunk",
    "non-insect_invertebrates": "crab lobster snail spider worm",
    "people": "baby boy girl man woman",
    "reptiles": "crocodile dinosaur lizard snake turtle",
    "small_mammals": "hamster mouse rabbit shrew squirrel",
    "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
    "vehicles_1": "bicycle bus motorcycle pickup_truck train",
    "vehicles_2": "lawn_mower rocket streetcar tank tractor",
}


def test_cifar100_table_matches_superclass_listing():
    fine = sorted(n for v in _SUPER.values() for n in v.split())
    assert len(fine) == 100
    coarse_names = sorted(_SUPER)
    table = [coarse_names.index(next(s for s, v in _SUPER.items() if f in v.split())) for f in fine]
    assert tuple(table) == tuple(CIFAR100_FINE_TO_COARSE)


def test_cifar100_map_cycles_within_superclasses():
    t = asymmetric_map("cifar100", 100)
    c = 4
    for nxt in (30, 55, 72, 95, 4):
        assert t[c] == nxt
        c = nxt
    coarse = np.asarray(CIFAR100_FINE_TO_COARSE)
    assert np.array_equal(np.sort(t), np.arange(100))      # a permutation
    assert np.all(t != np.arange(100))                      # no fixed point
    assert np.array_equal(coarse[t], coarse)                # stays in the superclass
    for s in range(20):                                     # brute force: sorted → next
        f = sorted(i for i in range(100) if coarse[i] == s)
        for k in range(5):
            assert t[f[k]] == f[(k + 1) % 5]


def test_generic_map_and_name_handling():
    assert np.array_equal(asymmetric_map("digits", 10), (np.arange(10) + 1) % 10)
    assert np.array_equal(asymmetric_map("imagefolder", 3), [1, 2, 0])
    assert np.array_equal(asymmetric_map("CIFAR-10", 10), asymmetric_map("cifar10", 10))
    with pytest.raises(NoiseError, match="num_classes=10"):
        asymmetric_map("cifar10", 5)
    with pytest.raises(NoiseError, match="num_classes=100"):
        asymmetric_map("cifar100", 10)


@pytest.mark.parametrize("r", [0.2, 0.4])
def test_asym_flip_frequency(r):
    n, C = 100_000, 10
    y = _clean(n, C)
    noisy = make_noisy_labels(y, C, "asym", r, seed=7, dataset="cifar10")
    t = asymmetric_map("cifar10", C)
    for c in range(C):
        m = y == c
        if t[c] == c:
            assert np.all(noisy[m] == c)
        else:
            assert set(np.unique(noisy[m])) <= {c, int(t[c])}
            assert abs(np.mean(noisy[m] == t[c]) - r) < 0.02    # sd ≈ 0.007
    assert abs(realised_noise_rate(y, noisy) - r * 0.5) < 0.01  # 5 of 10 classes flip


def test_asym_extremes_and_generic():
    y = _clean(1000, 10)
    assert np.array_equal(make_noisy_labels(y, 10, "asym", 0.0, 1, dataset="cifar10"), y)
    full = make_noisy_labels(y, 10, "asym", 1.0, 1, dataset="cifar10")
    assert np.array_equal(full, asymmetric_map("cifar10", 10)[y])
    gen = make_noisy_labels(y, 10, "asym", 1.0, 1, dataset="digits")
    assert np.array_equal(gen, (y + 1) % 10)
    y100 = _clean(500, 100)
    assert np.array_equal(make_noisy_labels(y100, 100, "asym", 1.0, 1, dataset="cifar100"),
                          asymmetric_map("cifar100", 100)[y100])


# ----------------------------------------------------------------------------- none / stats

def test_none_returns_copy():
    y = _clean(50, 5)
    out = make_noisy_labels(y, 5, "none", 0.0, 0)
    assert np.array_equal(out, y) and out.dtype == np.int64
    out[0] = 4
    assert y[0] == 0


def test_transition_matrix_brute_force():
    rng = np.random.default_rng(0)
    C = 4
    y = rng.integers(0, 3, size=500)         # class 3 has no clean examples
    yn = rng.integers(0, C, size=500)
    T = transition_matrix(y, yn, C)
    ref = np.zeros((C, C))
    for a, b in zip(y, yn):
        ref[a, b] += 1
    for c in range(C):
        if ref[c].sum() > 0:
            ref[c] /= ref[c].sum()
    assert T.dtype == np.float64 and np.allclose(T, ref, rtol=0, atol=1e-15)
    assert np.allclose(T[:3].sum(1), 1.0) and np.all(T[3] == 0)


def test_realised_rate_and_identity_matrix():
    y = _clean(100, 10)
    yn = y.copy()
    yn[:7] = (yn[:7] + 1) % 10
    assert realised_noise_rate(y, yn) == 0.07
    assert np.array_equal(transition_matrix(y, y, 10), np.eye(10))


# ----------------------------------------------------------------------------- files

def test_file_formats(tmp_path):
    n, C = 20, 5
    y = _clean(n, C)
    labels = np.random.default_rng(0).integers(0, C, size=n)
    np.save(tmp_path / "a.npy", labels)
    (tmp_path / "b.csv").write_text("label\n" + "\n".join(map(str, labels)) + "\n")
    (tmp_path / "c.txt").write_text("\n".join(map(str, labels)))
    torch.save(torch.from_numpy(labels), tmp_path / "d.pt")
    # CIFAR-N style: a dict of numpy arrays saved with torch.save
    torch.save({"clean_label": y, "worse_label": labels, "aggre_label": y.astype(np.int32)}, tmp_path / "e.pt")
    np.savez(tmp_path / "f.npz", noisy_label=labels)
    for f, key in [("a.npy", None), ("b.csv", None), ("c.txt", None), ("d.pt", None),
                   ("e.pt", "worse_label"), ("f.npz", "noisy_label")]:
        out = make_noisy_labels(y, C, "file", 0.0, 0, file=tmp_path / f, file_key=key)
        assert out.dtype == np.int64 and np.array_equal(out, labels), f
    out = make_noisy_labels(y, C, "file", 0.0, 0, file=tmp_path / "e.pt", file_key="aggre_label")
    assert np.array_equal(out, y)


def test_file_errors(tmp_path):
    n, C = 10, 3
    y = _clean(n, C)
    np.save(tmp_path / "short.npy", np.zeros(n - 1, dtype=np.int64))
    np.save(tmp_path / "range.npy", np.full(n, C, dtype=np.int64))
    np.save(tmp_path / "frac.npy", np.full(n, 0.5))
    torch.save({"worse_label": y, "aggre_label": y}, tmp_path / "d.pt")
    (tmp_path / "bad.csv").write_text("label\n1\nx\n")
    (tmp_path / "bad.json").write_text("[]")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    cases = [
        ("short.npy", None, r"short\.npy.*expected 10"),
        ("range.npy", None, r"range\.npy.*\[0, 3\)"),
        ("frac.npy", None, r"frac\.npy.*integers"),
        ("d.pt", "random_label1", r"d\.pt has no key 'random_label1'.*worse_label, aggre_label"),
        ("d.pt", None, r"d\.pt needs `file_key`.*worse_label"),
        ("bad.csv", None, r"bad\.csv: line 3"),
        ("bad.json", None, r"bad\.json.*unsupported extension"),
        ("junk.pt", None, r"cannot read noisy-label file .*junk\.pt"),
        ("missing.npy", None, r"missing\.npy does not exist"),
        ("short.npy", "k", r"not a dict"),
    ]
    for f, key, msg in cases:
        with pytest.raises(NoiseError, match=msg):
            make_noisy_labels(y, C, "file", 0.0, 0, file=tmp_path / f, file_key=key)
    with pytest.raises(NoiseError, match="needs `file`"):
        make_noisy_labels(y, C, "file", 0.0, 0)


def test_torch_file_refuses_arbitrary_pickles(tmp_path):
    from fractions import Fraction   # any non-tensor class: its pickle could run code
    torch.save({"worse_label": np.arange(3), "obj": Fraction(1, 2)}, tmp_path / "evil.pt")
    with pytest.raises(NoiseError, match="weights_only"):
        make_noisy_labels(np.arange(3), 3, "file", 0.0, 0, file=tmp_path / "evil.pt", file_key="worse_label")


# ----------------------------------------------------------------------------- the authors' draws

class _AuthorsDataset:
    """The authors' noise procedure as their dataset class runs it (read from the public
    repository ShikunLi/Sel-CL, CIFAR/dataset/cifar_dataset.py), one draw at a time:
    `np.random.seed(seed)` there is numpy's global RandomState, so a RandomState(seed) of
    our own gives the same stream without touching the global one."""

    def __init__(self, targets, num_classes, noise_ratio, seed):
        self.targets, self.C, self.r, self.rs = list(targets), num_classes, noise_ratio, np.random.RandomState(seed)
        self.num = int(len(self.targets) * noise_ratio)

    def symmetric(self, exclude_true=False):
        idxes = self.rs.permutation(len(self.targets))
        for i in range(len(idxes)):
            if i < self.num:
                label = self.rs.randint(self.C, dtype=np.int32)
                while exclude_true and label == self.targets[idxes[i]]:   # their commented-out loop
                    label = self.rs.randint(self.C, dtype=np.int32)
                self.targets[idxes[i]] = label
        return np.asarray(self.targets)

    def asymmetric(self, which):
        if which == "cifar10" and self.num == 0:    # their CIFAR-10 class draws only when int(N·r) > 0
            return np.asarray(self.targets)
        if which == "cifar10":      # truck→automobile, bird→airplane, cat→dog, dog→cat, deer→horse
            conf = np.identity(self.C)
            for src, dst in ((9, 1), (2, 0), (3, 5), (5, 3), (4, 7)):
                conf[src, src], conf[src, dst] = 1 - self.r, self.r
        else:                       # CIFAR-100: each fine class → the next of its superclass
            conf = np.identity(self.C) * (1 - self.r)
            coarse = np.asarray(CIFAR100_FINE_TO_COARSE)[np.asarray(self.targets)]
            for s in range(20):
                clean = np.unique(np.asarray(self.targets)[coarse == s])
                for a, b in zip(clean, np.concatenate([clean[1:], clean[:1]])):
                    conf[a, b] = self.r
        idxes = self.rs.permutation(len(self.targets))
        for i in range(len(idxes)):
            current = self.targets[idxes[i]]
            self.targets[idxes[i]] = self.rs.choice(np.arange(0, self.C), p=conf[current, :].transpose())
        return np.asarray(self.targets)


def _shuffled_labels(n, C, seed=0):
    return np.random.default_rng(seed).permutation(np.arange(n) % C).astype(np.int64)


@pytest.mark.parametrize("C,kind,r,exclude", [
    (10, "sym", 0.2, False), (10, "sym", 0.8, False), (10, "sym", 0.4, True), (100, "sym", 0.5, False),
    (10, "asym", 0.1, False), (10, "asym", 0.4, False), (10, "asym", 1.0, False), (100, "asym", 0.4, False)])
def test_authors_generator_gives_their_labels(C, kind, r, exclude):
    """generator='authors' reproduces, label for label, the authors' one-draw-at-a-time
    procedure for the same clean labels in the same order (CIFAR in torchvision's order:
    the paper's noisy labels)."""
    y = _shuffled_labels(3000, C)
    ds = "cifar10" if C == 10 else "cifar100"
    ref = _AuthorsDataset(y, C, r, 42)
    want = ref.symmetric(exclude) if kind == "sym" else ref.asymmetric(ds)
    got = make_noisy_labels(y, C, kind, r, 42, dataset=ds, include_true_class=not exclude, generator="authors")
    assert got.dtype == np.int64 and np.array_equal(got, want)
    other_seed = make_noisy_labels(y, C, kind, r, 43, dataset=ds, include_true_class=not exclude, generator="authors")
    assert np.array_equal(other_seed, got) == (kind == "asym" and r == 1.0)    # r = 1 draws nothing that matters


def test_authors_cifar10_asym_draws_nothing_below_one_flip():
    """Their CIFAR-10 class skips the draws when int(N·r) = 0 (every label stays clean);
    their CIFAR-100 class has no such rule."""
    y = _shuffled_labels(99, 10)
    assert np.array_equal(make_noisy_labels(y, 10, "asym", 0.01, 5, dataset="cifar10", generator="authors"), y)
    for seed in range(20):
        want = _AuthorsDataset(y, 10, 0.01, seed).asymmetric("cifar10")
        assert np.array_equal(make_noisy_labels(y, 10, "asym", 0.01, seed, dataset="cifar10", generator="authors"),
                              want)
    y100 = _shuffled_labels(200, 100)                  # every class present (their ring reads the targets)
    flipped = [not np.array_equal(make_noisy_labels(y100, 100, "asym", 0.004, s, dataset="cifar100",
                                                    generator="authors"), y100) for s in range(20)]
    assert any(flipped)
    for seed in range(5):
        assert np.array_equal(make_noisy_labels(y100, 100, "asym", 0.004, seed, dataset="cifar100",
                                                generator="authors"),
                              _AuthorsDataset(y100, 100, 0.004, seed).asymmetric("cifar100"))


@pytest.mark.parametrize("generator", ["pcg64", "authors"])
def test_sym_without_the_true_class_needs_two_classes(generator):
    with pytest.raises(NoiseError, match="num_classes ≥ 2"):
        make_noisy_labels(np.zeros(5, dtype=np.int64), 1, "sym", 0.4, 0, include_true_class=False, generator=generator)


def test_authors_sym_truncates_like_int():
    """The authors redraw int(N·r) labels: 0.29·100 = 28.999… gives 28 there (29 with
    `floor_count`, the pcg64 path's exact ⌊r·N⌋)."""
    y = _shuffled_labels(100, 10)
    assert _AuthorsDataset(y, 10, 0.29, 1).num == 28 and floor_count(0.29, 100) == 29
    want = _AuthorsDataset(y, 10, 0.29, 1).symmetric(exclude_true=True)
    got = make_noisy_labels(y, 10, "sym", 0.29, 1, include_true_class=False, generator="authors")
    assert np.array_equal(got, want) and int(np.sum(got != y)) == 28


def test_authors_reference_tells_choice_from_a_threshold():
    """A check of the reference, not of selcl: the same uniforms read as "flip where u < r"
    (the pcg64 path's rule) are not the authors' labels — numpy's `choice` walks the
    cumulative row, so a class whose target has a larger id (cat→dog, deer→horse) flips
    where u ≥ 1 − r instead — so the test above can tell the two rules apart."""
    y = _shuffled_labels(3000, 10)
    want = _AuthorsDataset(y, 10, 0.4, 42).asymmetric("cifar10")
    rs = np.random.RandomState(42)
    perm, u = rs.permutation(len(y)), rs.random_sample(len(y))
    t = asymmetric_map("cifar10", 10)
    naive = y.copy()
    flip = (u < 0.4) & (t[y[perm]] != y[perm])
    naive[perm[flip]] = t[y[perm[flip]]]
    assert not np.array_equal(naive, want)
    same = np.isin(y, [9, 2, 5])                 # targets with smaller ids: u < r is their rule too
    assert np.array_equal(naive[same], want[same])


def test_generators_resolve_and_differ():
    assert GENERATORS == ("auto", "authors", "pcg64")
    assert resolve_generator("auto", "cifar10") == resolve_generator("auto", "CIFAR-100") == "authors"
    assert resolve_generator("auto", "imagefolder") == resolve_generator("auto", "digits") == "pcg64"
    assert resolve_generator("pcg64", "cifar10") == "pcg64" and resolve_generator("authors", "digits") == "authors"
    with pytest.raises(NoiseError, match="generator 'mt'"):
        resolve_generator("mt", "cifar10")
    for kind in ("sym", "none"):
        with pytest.raises(NoiseError, match="'pcg64' or 'authors'"):
            make_noisy_labels(_clean(10, 2), 2, kind, 0.2, 0, generator="auto")
    y = _shuffled_labels(1000, 10)
    assert not np.array_equal(make_noisy_labels(y, 10, "sym", 0.4, 42, generator="authors"),
                              make_noisy_labels(y, 10, "sym", 0.4, 42))


# ----------------------------------------------------------------------------- parameter errors

@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan"), "x"])
def test_bad_rate(rate):
    with pytest.raises(NoiseError, match="`rate`"):
        make_noisy_labels(_clean(10, 2), 2, "sym", rate, 0)


def test_bad_kind_and_labels():
    with pytest.raises(NoiseError, match=r"`noise`.*none, sym, asym, file"):
        make_noisy_labels(_clean(10, 2), 2, "pairflip", 0.2, 0)
    assert NOISE_KINDS == ("none", "sym", "asym", "file")
    with pytest.raises(NoiseError, match=r"\[0, 2\)"):
        make_noisy_labels(np.array([0, 2]), 2, "sym", 0.2, 0)
    assert issubclass(NoiseError, ValueError)
