"""selcl/pairs.py: which examples and pairs each Table 4 / Table 6 variant trains on,
on five examples small enough to write every answer down by hand."""
from types import SimpleNamespace

import pytest
import torch

from selcl.pairs import configured_rule, pair_rule

#                     0  1  2  3  4
NOISY = torch.tensor([0, 0, 1, 1, 0])
CLEAN = torch.tensor([0, 1, 1, 1, 0])          # example 1 is a "1" labelled 0
T = torch.tensor([True, False, True, True, False])
ALL = torch.arange(5)


def fake_selection():
    """A selection whose own pair mask says: only (0, 2) and the diagonal."""
    def pair_mask(i, j):
        m = i[:, None] == j[None, :]
        return m | ((i[:, None] == 0) & (j[None, :] == 2))
    return SimpleNamespace(examples=T.clone(), pair_mask=pair_mask)


def grid(rule):
    return rule.in_G(ALL, ALL)


def test_sel_cl_uses_the_selection_itself():
    rule = pair_rule(fake_selection(), NOISY, CLEAN, selected_sets="T_G1_G2")
    assert rule.examples.tolist() == T.tolist()
    g = grid(rule)
    assert g[0, 2] and not g[2, 0] and g.diagonal().all() and g.sum() == 6


def test_all_is_every_example_and_every_same_noisy_label_pair():
    rule = pair_rule(fake_selection(), NOISY, CLEAN, selected_sets="all")
    assert rule.examples.all()
    assert torch.equal(grid(rule), NOISY[:, None] == NOISY[None, :])


def test_T_G1_pairs_only_members_of_T_with_each_other_and_everyone_with_itself():
    g = grid(pair_rule(fake_selection(), NOISY, CLEAN, selected_sets="T_G1"))
    assert g.diagonal().all()
    assert g[2, 3] and g[3, 2]                  # both in T, same label
    assert not g[0, 4] and not g[0, 1]          # same label, but 4 and 1 are outside T
    assert not g[0, 2]                          # both in T, different labels
    assert g.sum() == 5 + 2


def test_clean_oracles_take_the_truly_clean_examples():
    is_clean = (NOISY == CLEAN).tolist()
    assoc = pair_rule(None, NOISY, CLEAN, selected_sets="clean_assoc")
    assert assoc.examples.tolist() == is_clean
    g = grid(assoc)
    assert g[0, 4] and not g[0, 1] and g[1, 1]  # 1 is wrongly labelled: only itself
    all_pairs = grid(pair_rule(None, NOISY, CLEAN, selected_sets="clean_all_pairs"))
    assert all_pairs[0, 1] and torch.equal(all_pairs, NOISY[:, None] == NOISY[None, :])
    clean_clean = pair_rule(None, NOISY, CLEAN, selected_sets="clean_clean")
    assert clean_clean.examples.all()
    g = grid(clean_clean)
    assert g[1, 2] and not g[0, 1]              # pairs by the true label


def test_configured_rule_reads_the_pretrain_section():
    sel = fake_selection()
    t_g1 = configured_rule(sel, NOISY, CLEAN, {"selected_sets": "T_G1", "selection": True})
    assert t_g1.name == "T_G1" and torch.equal(grid(t_g1), grid(pair_rule(sel, NOISY, CLEAN, selected_sets="T_G1")))
    off = configured_rule(sel, NOISY, CLEAN, {"selected_sets": "T_G1_G2", "selection": False})
    assert off.name == "all" and off.examples.all()     # Table 6, "no selection"


def test_an_unknown_variant_names_the_parameter():
    with pytest.raises(ValueError, match="pretrain.selected_sets.*'T_G3'"):
        pair_rule(fake_selection(), NOISY, CLEAN, selected_sets="T_G3")
