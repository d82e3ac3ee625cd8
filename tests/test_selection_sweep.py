"""bench/selection_sweep.py: the selection of a saved encoder at other K, as `select` gives it."""
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def saved_run(folder: Path, setting: str, kind: str, examples_every: int | None = None):
    """runs/<setting>/ of a finished pre-training on digits: data.npz, labels.npz (40 % `kind`
    noise) and pretrain.pt with an untrained encoder (and, given `examples_every`, every
    such example as the run's own final T, pretrain.pt's "examples"). Returns (cfg, dataset,
    noisy labels, model)."""
    from selcl.config import load_params, resolve
    from selcl.data import load_dataset, save_arrays
    from selcl.noise import make_noisy_labels
    from selcl.train import make_model

    cfg = resolve(load_params(ROOT / "params.yaml"), setting)
    run = folder / setting
    ds = load_dataset("digits")
    save_arrays(ds, run / "data.npz")
    noisy = make_noisy_labels(ds.y_train, 10, kind, 0.4, 42, dataset="digits")
    np.savez(run / "labels.npz", noisy=noisy, clean=ds.y_train, num_classes=10)
    torch.manual_seed(0)
    model = make_model(cfg["model"], 10, torch.device("cpu"))
    state = {"model": model.state_dict()}
    if examples_every:
        state["examples"] = torch.zeros(len(noisy), dtype=torch.bool)
        state["examples"][::examples_every] = True
    torch.save(state, run / "pretrain.pt")
    return cfg, ds, noisy, model


def test_sweep_rows_are_the_selection_of_the_saved_encoder(tmp_path, capsys):
    import selection_sweep

    from selcl.evaluate import embed
    from selcl.selection import select
    from selcl.train import TrainData

    run = tmp_path / "demo_sym40"
    cfg, ds, noisy, model = saved_run(tmp_path, "demo_sym40", "sym", examples_every=3)
    T = torch.load(run / "pretrain.pt", weights_only=False)["examples"]

    assert selection_sweep.main([str(run), "--k", "5", "40", "--alpha", "0.5", "--per-class"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith(("| 5 | 0.5 |", "| 40 | 0.5 |"))]
    table = out.split("| given label |", 1)[1].splitlines()[2:]      # the --per-class table
    assert len(table) == 10
    for c, row in enumerate(table):                   # each class: its name and its part of T
        cells = [x.strip() for x in row.strip("|").split("|")]
        assert cells[0] == str(ds.classes[c]) and int(cells[1]) == int((T & (torch.as_tensor(noisy) == c)).sum())
    assert len(rows) == 2
    data = TrainData.load(run, torch.device("cpu"))
    z, _ = embed(model, data.x, data.mean, data.std)
    for row, k in zip(rows, (5, 40)):
        st = select(z, data.noisy, 10, k=k, alpha=0.5, beta=cfg["pretrain"]["beta"],
                    seed=cfg["pretrain"]["epochs"], clean_labels=data.clean).stats
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[3]) == st["n_selected"] and float(cells[4]) == round(st["precision_T"], 3)


def test_both_scorings_of_T_on_one_encoder(tmp_path, capsys):
    """--pseudo-labels true false: one row per scoring, each the selection `select` gives."""
    import selection_sweep

    from selcl.evaluate import embed
    from selcl.selection import select
    from selcl.train import TrainData

    run = tmp_path / "demo_asym40"
    cfg, ds, noisy, model = saved_run(tmp_path, "demo_asym40", "asym")

    assert selection_sweep.main([str(run), "--k", "25", "--pseudo-labels", "true", "false"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 25 |")]
    assert [[c.strip() for c in r.strip("|").split("|")][6] for r in rows] == ["with", "without"]
    data = TrainData.load(run, torch.device("cpu"))
    z, _ = embed(model, data.x, data.mean, data.std)
    got = []
    for row, pseudo in zip(rows, (True, False)):
        st = select(z, data.noisy, 10, k=25, alpha=cfg["pretrain"]["alpha"], beta=cfg["pretrain"]["beta"],
                    seed=cfg["pretrain"]["epochs"], clean_labels=data.clean, pseudo_labels=pseudo).stats
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[3]) == st["n_selected"] and float(cells[4]) == round(st["precision_T"], 3)
        got.append((cells[3], cells[4]))
    assert got[0] != got[1]                       # the two scorings differ on this encoder


def test_per_class_table_counts_by_given_label():
    """Precision of T by given label, and the true classes of the wrong ones."""
    from selection_sweep import per_class_table
    #             T:      1  1  1  1  0  1  1
    noisy = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    clean = torch.tensor([0, 0, 2, 1, 0, 2, 2])
    T = torch.tensor([1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    rows = per_class_table(T, noisy, clean, ["a", "b", "c"]).splitlines()[2:]
    assert rows[0] == "| a | 3 | 0.667 | c (1) |"
    assert rows[1] == "| b | 2 | 0.500 | c (1) |"      # the unselected wrong one (true a) is not counted
    assert rows[2] == "| c | 1 | 1.000 | – |"


def test_both_versions_of_the_selection_on_one_encoder(tmp_path, capsys):
    """--version v1 v2: one row per version of the selection, each what `select` gives
    (T, γ, |G|, precision of G)."""
    import selection_sweep

    from selcl.evaluate import embed
    from selcl.selection import select
    from selcl.train import TrainData

    run = tmp_path / "demo_asym40"
    cfg, ds, noisy, model = saved_run(tmp_path, "demo_asym40", "asym")

    assert selection_sweep.main([str(run), "--k", "25", "--version", "v1", "v2"]) == 0
    rows = [[c.strip() for c in r.strip("|").split("|")]
            for r in capsys.readouterr().out.splitlines() if r.startswith("| 25 |")]
    assert [r[7] for r in rows] == ["v1", "v2"]
    data = TrainData.load(run, torch.device("cpu"))
    z, _ = embed(model, data.x, data.mean, data.std)
    for cells, version in zip(rows, ("v1", "v2")):
        st = select(z, data.noisy, 10, k=25, alpha=cfg["pretrain"]["alpha"], beta=cfg["pretrain"]["beta"],
                    seed=cfg["pretrain"]["epochs"], clean_labels=data.clean, version=version).stats
        assert int(cells[3]) == st["n_selected"] and float(cells[4]) == round(st["precision_T"], 3)
        assert float(cells[8]) == round(st["threshold"], 4) and int(cells[9]) == int(st["n_pairs"])
        assert float(cells[10]) == round(st["precision_G"], 3)
    assert rows[0][8] != rows[1][8]                # the two γ differ on this encoder


def test_precision_rows_select_from_embeddings_under_each_autocast_dtype(tmp_path, capsys):
    """--precision fp32 bf16: the fp32 row is the selection against itself (nothing differs);
    the bf16 row is `select` on the embeddings computed under CPU bf16 autocast, its
    differences from fp32's T and ŷ counted."""
    import selection_sweep

    from selcl.evaluate import embed
    from selcl.selection import select
    from selcl.train import TrainData

    run = tmp_path / "demo_asym40"
    cfg, ds, noisy, model = saved_run(tmp_path, "demo_asym40", "asym")
    assert selection_sweep.main([str(run), "--k", "25", "--precision", "fp32", "bf16"]) == 0
    out = capsys.readouterr().out.split("| embedding |", 1)[1].splitlines()[2:4]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in out}
    assert cells["fp32"][3:5] == ["0 / 0", "0"] and float(cells["fp32"][6]) == 0.0
    data, pc = TrainData.load(run, torch.device("cpu")), cfg["pretrain"]
    kw = dict(k=pc["k"], alpha=pc["alpha"], beta=pc["beta"], seed=pc["epochs"], clean_labels=data.clean)
    z32, _ = embed(model, data.x, data.mean, data.std)
    z16, _ = embed(model, data.x, data.mean, data.std, autocast_dtype=torch.bfloat16)
    assert not torch.equal(z16, z32)                         # the rounding is there to measure
    ref, sel = select(z32, data.noisy, 10, **kw), select(z16, data.noisy, 10, **kw)
    assert int(cells["bf16"][1]) == sel.stats["n_selected"]
    assert cells["bf16"][3] == f"{int((sel.examples & ~ref.examples).sum())} / {int((ref.examples & ~sel.examples).sum())}"
    assert int(cells["bf16"][4]) == int((sel.pseudo_labels != ref.pseudo_labels).sum())
