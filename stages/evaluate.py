"""Stage `evaluate@<setting>`: weighted k-NN of the Sel-CL encoder (SPEC §8, paper Table 2),
clean- and noisy-label protocols, and a t-SNE of test embeddings → evaluate.json, tsne.npz."""
import numpy as np
from common import load, main, require_device, run_dir

from selcl import checkpoint
from selcl.train import TrainData, knn_report


def run(name: str) -> None:
    cfg = load(name)
    device = require_device(cfg)
    out = run_dir(name)
    data = TrainData.load(out, device)
    pre = checkpoint.load(out / "pretrain.pt", what="pre-training output")
    metrics, z_test = knn_report(pre["model"], cfg, data, device)
    checkpoint.write_json(out / "evaluate.json", metrics)
    n = min(cfg["evaluate"]["tsne_points"], len(z_test))
    if n >= 5:
        from sklearn.manifold import TSNE
        pick = np.random.default_rng(0).choice(len(z_test), size=n, replace=False)
        pick.sort()
        emb = TSNE(n_components=2, init="pca", random_state=0,
                   perplexity=min(30.0, (n - 1) / 3)).fit_transform(z_test[pick].cpu().numpy())
    else:
        pick, emb = np.zeros(0, dtype=int), np.zeros((0, 2))
    with checkpoint.atomic_path(out / "tsne.npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, xy=emb.astype(np.float32), labels=data.y_test.cpu().numpy()[pick])
    print(f"[evaluate] {name}: weighted kNN top-1 clean {metrics['knn_clean_top1']:.2f} / "
          f"noisy {metrics['knn_noisy_top1']:.2f}; Sel-CL classifier {metrics['selcl_test_top1']:.2f}")


if __name__ == "__main__":
    main(run)
