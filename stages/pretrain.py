"""Stage `pretrain@<setting>`: Sel-CL pre-training with per-epoch selection (SPEC §5, §6)
→ runs/<setting>/pretrain.pt, pretrain.json and pretrain_history.csv (rewritten after
every epoch: the paper's Fig. 3 in `dvc plots show`)."""
from common import check_sizes, checkpoint_path, live_history, load, main, require_device, run_dir, write_history

from selcl import checkpoint, dist
from selcl.device import describe
from selcl.train import TrainData, pretrain


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    check_sizes(cfg, data.n, ("pretrain",))
    warm = checkpoint.load(out / "warmup.pt", what="warm-up output")
    fp = checkpoint.fingerprint("pretrain", cfg["model"], cfg["warmup"], cfg["pretrain"], cfg["evaluate"],
                                checkpoint.file_digest(out / "warmup.pt"))
    ckpt = checkpoint.Checkpointer(checkpoint_path(name, "pretrain"), fp, cfg["pretrain"]["checkpoint_every"])
    state = pretrain(cfg, data, warm, device, ckpt, on_epoch=live_history(out / "pretrain_history.csv"))
    if not dist.is_main():      # torchrun: rank 0 writes the outputs
        return
    timing = state.pop("timing")
    check = state.pop("encoder_check")    # knn_top1_init, l_sel(_no_information), encoder_learned
    checkpoint.save(state, out / "pretrain.pt")
    write_history(out / "pretrain_timing.csv", timing)   # wall-clock, not reproducible
    write_history(out / "pretrain_history.csv", state["history"])
    last = state["history"][-1]
    summary = {k: last[k] for k in ("n_selected", "n_per_class", "threshold", "n_pairs", "precision_T",
                                    "recall_T", "precision_G", "pseudo_label_accuracy", "knn_top1", "test_acc")
               if k in last}
    summary.update(check or {})           # the report flags an encoder that learned nothing
    summary["env"] = describe(device)     # for the report's environment table (not a DVC metric)
    checkpoint.write_json(out / "pretrain.json", summary)
    ckpt.discard()              # outputs written: the resume state is no longer needed


if __name__ == "__main__":
    main(run)
