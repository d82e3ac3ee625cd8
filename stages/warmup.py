"""Stage `warmup@<setting>`: Uns-CL warm-up (SPEC §4), the first global epoch(s) of the
pre-training run (same loader, optimiser and lr schedule, §10.3) → runs/<setting>/warmup.pt."""
from common import check_sizes, load, main, require_device, run_dir, write_history

from selcl import checkpoint, dist
from selcl.train import WARMUP_PRETRAIN_KEYS, TrainData, warmup


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    check_sizes(cfg, data.n, ("pretrain",))   # one loader, one optimiser for both stages
    reads = {k: cfg["pretrain"][k] for k in WARMUP_PRETRAIN_KEYS}   # not α, β, K: a sweep keeps the warm-up
    fp = checkpoint.fingerprint("warmup", cfg["model"], cfg["warmup"], reads,
                                checkpoint.file_digest(out / "labels.npz"))
    ckpt = checkpoint.Checkpointer(out / "ckpt" / "warmup.pt", fp, cfg["warmup"]["checkpoint_every"])
    state = warmup(cfg, data, device, ckpt)
    if not dist.is_main():      # torchrun: rank 0 writes the outputs
        return
    checkpoint.save(state, out / "warmup.pt")
    write_history(out / "warmup_history.csv", state["history"])


if __name__ == "__main__":
    main(run)
