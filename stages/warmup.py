"""Stage `warmup@<setting>`: Uns-CL warm-up (SPEC §4), the first global epoch(s) of the
pre-training run (same loader, optimiser and lr schedule, §10.3) → runs/<setting>/warmup.pt."""
from common import check_sizes, checkpoint_path, live_history, load, main, require_device, run_dir, write_history

from selcl import checkpoint, dist
from selcl.sources import output_digest
from selcl.train import TrainData, warmup


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    check_sizes(cfg, data.n, ("pretrain",), k=False)   # one loader, one optimiser for both stages
    fp = checkpoint.fingerprint("warmup", cfg["model"], cfg["warmup"], cfg["pretrain"],
                                checkpoint.file_digest(out / "labels.npz"), output_digest(out / "data.npz", save=dist.is_main()))
    ckpt = checkpoint.Checkpointer(checkpoint_path(name, "warmup"), fp, cfg["warmup"]["checkpoint_every"])
    state = warmup(cfg, data, device, ckpt, on_epoch=live_history(out / "warmup_history.csv"))
    if not dist.is_main():      # torchrun: rank 0 writes the outputs
        return
    checkpoint.save(state, out / "warmup.pt")
    write_history(out / "warmup_history.csv", state["history"])
    ckpt.discard()              # outputs written: the resume state is no longer needed


if __name__ == "__main__":
    main(run)
