"""Stage `finetune@<setting>`: Sel-CL+ fine-tuning on the final T (SPEC §7)
→ runs/<setting>/finetune.pt, finetune_history.csv (plots), finetune.json (metrics)."""
import time

from common import StageError, checkpoint_path, live_history, load, main, require_device, run_dir, write_history

from selcl import checkpoint, dist
from selcl.train import TrainData, finetune, summarise


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    pre = checkpoint.load(out / "pretrain.pt", what="pre-training output")
    if "examples" not in pre:
        raise StageError(f"{out / 'pretrain.pt'}: not a pre-training output (no selection); rerun pretrain")
    n_T = int(pre["examples"].sum())
    if n_T == 0:
        raise StageError(f"settings.{name}.pretrain.alpha = {cfg['pretrain']['alpha']}: the final "
                         f"selection T is empty, nothing to fine-tune on (raise alpha, or lower k if it "
                         f"is near the images per class)")
    fp = checkpoint.fingerprint("finetune", cfg["model"], cfg["finetune"], checkpoint.file_digest(out / "pretrain.pt"))
    ckpt = checkpoint.Checkpointer(checkpoint_path(name, "finetune"), fp, cfg["finetune"]["checkpoint_every"])
    t0 = time.perf_counter()
    state = finetune(cfg, data, pre, device, ckpt, on_epoch=live_history(out / "finetune_history.csv"))
    if not dist.is_main():      # torchrun: rank 0 writes the outputs
        return
    checkpoint.save({"model": state["model"]}, out / "finetune.pt")
    write_history(out / "finetune_history.csv", state["history"])
    metrics = summarise(state["history"], cfg["finetune"]["eval_last"])
    metrics["n_train"] = state["n_train"]
    # wall-clock (since the last resume): the cost of Sel-CL+'s verdict in the label-issues report
    metrics["seconds"] = round(time.perf_counter() - t0, 1)
    checkpoint.write_json(out / "finetune.json", metrics)
    ckpt.discard()              # outputs written: the resume state is no longer needed
    print(f"[finetune] {name}: Sel-CL+ test acc {metrics['test_acc_mean_last']:.2f} "
          f"(mean of last {cfg['finetune']['eval_last']}), final {metrics['test_acc_last']:.2f}")


if __name__ == "__main__":
    main(run)
