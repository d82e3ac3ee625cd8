"""Which examples and pairs the losses use: Sel-CL's selection, or a Table 4 / Table 6 variant.

`PairRule` is what the training loop consumes: `.examples` (bool [N], the set the
classifier and fine-tuning draw from) and `.in_G(i, j)` (bool [len(i), len(j)]).

  selected_sets (paper Table 4, 40 % asym):
    T_G1_G2         Sel-CL: T and G = G′ ∪ G″                          (default)
    T_G1            T and G′ only (no threshold pairs G″)
    all             all examples, all same-noisy-label pairs
    clean_assoc     oracle: the truly clean examples as T, pairs among them
                    associated by the (then correct) noisy label
    clean_all_pairs oracle: the clean examples as T, all same-noisy-label pairs
    clean_clean     oracle: all examples, pairs by the clean label
  selection: false (Table 6 "no selection") is `all`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class PairRule:
    examples: torch.Tensor                      # bool [N]
    in_G: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    name: str


def _same(labels: torch.Tensor):
    def in_G(i, j):
        return labels[i][:, None] == labels[j][None, :]
    return in_G


def _within(labels: torch.Tensor, members: torch.Tensor):
    """(i, j) ∈ G  ⇔  same label and (i = j or both members)."""
    def in_G(i, j):
        same = labels[i][:, None] == labels[j][None, :]
        both = members[i][:, None] & members[j][None, :]
        return same & (both | (i[:, None] == j[None, :]))
    return in_G


def pair_rule(selection, noisy: torch.Tensor, clean: torch.Tensor, *, selected_sets: str,
              use_selection: bool = True) -> PairRule:
    """Build the rule for the configured variant from this epoch's `selection`.

    noisy, clean: int64 [N] on the training device (clean labels are only read by
    the oracle variants, which exist to reproduce Table 4)."""
    n = noisy.shape[0]
    everyone = torch.ones(n, dtype=torch.bool, device=noisy.device)
    if not use_selection or selected_sets == "all":
        return PairRule(everyone, _same(noisy), "all")
    if selected_sets == "T_G1_G2":
        return PairRule(torch.as_tensor(selection.examples, device=noisy.device).bool(),
                        selection.pair_mask, "T_G1_G2")
    if selected_sets == "T_G1":
        T = torch.as_tensor(selection.examples, device=noisy.device).bool()
        return PairRule(T, _within(noisy, T), "T_G1")
    is_clean = noisy == clean
    if selected_sets == "clean_assoc":
        return PairRule(is_clean, _within(noisy, is_clean), "clean_assoc")
    if selected_sets == "clean_all_pairs":
        return PairRule(is_clean, _same(noisy), "clean_all_pairs")
    if selected_sets == "clean_clean":
        return PairRule(everyone, _same(clean), "clean_clean")
    raise ValueError(f"pretrain.selected_sets: unknown variant '{selected_sets}'")


def configured_rule(selection, noisy: torch.Tensor, clean: torch.Tensor, pc: dict) -> PairRule:
    """`pair_rule` as the `pretrain` params section `pc` configures it
    (`selected_sets`, and `selection: false` for Table 6's "no selection")."""
    return pair_rule(selection, noisy, clean, selected_sets=pc["selected_sets"], use_selection=pc["selection"])
