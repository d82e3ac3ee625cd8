"""Stage `baseline@<setting>`: cross-entropy on the noisy labels, same network and
weak augmentation → runs/<setting>/baseline.json, baseline_history.csv."""
from common import check_sizes, checkpoint_path, live_history, load, main, require_device, run_dir, write_history

from selcl import checkpoint, dist
from selcl.sources import output_digest
from selcl.train import TrainData, baseline, summarise


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    if not cfg["baseline"]["enabled"]:
        if not dist.is_main():
            return
        # Switched off for this setting: record that, so the report shows "—".
        checkpoint.write_json(out / "baseline.json", {"enabled": False})
        write_history(out / "baseline_history.csv", [])
        print(f"[baseline] {name}: disabled")
        return
    data = TrainData.load(out, device)
    check_sizes(cfg, data.n, ("baseline",))
    fp = checkpoint.fingerprint("baseline", cfg["model"], cfg["baseline"], checkpoint.file_digest(out / "labels.npz"),
                                output_digest(out / "data.npz", save=dist.is_main()))
    ckpt = checkpoint.Checkpointer(checkpoint_path(name, "baseline"), fp, cfg["baseline"]["checkpoint_every"])
    state = baseline(cfg, data, device, ckpt, on_epoch=live_history(out / "baseline_history.csv"))
    if not dist.is_main():      # torchrun: rank 0 writes the outputs
        return
    write_history(out / "baseline_history.csv", state["history"])
    metrics = {"enabled": True, **summarise(state["history"], cfg["baseline"]["eval_last"])}
    checkpoint.write_json(out / "baseline.json", metrics)
    ckpt.discard()              # outputs written: the resume state is no longer needed
    print(f"[baseline] {name}: CE test acc {metrics['test_acc_mean_last']:.2f}")


if __name__ == "__main__":
    main(run)
