"""Input-file digests (selcl/sources.py), which make data.path and noise.file DVC
dependencies through the config stage: content changes are seen, stats are cached."""
import os

from selcl.sources import DigestCache, digest


def test_file_and_folder_digests_follow_the_content(tmp_path):
    cache = DigestCache(tmp_path / "scratch" / "digests.json")
    labels = tmp_path / "labels.csv"
    labels.write_text("1\n2\n3\n")
    first = digest(labels, cache)
    labels.write_text("1\n2\n4\n")                       # one label changed
    assert digest(labels, cache) != first
    folder = tmp_path / "images"
    (folder / "train" / "a").mkdir(parents=True)
    (folder / "train" / "a" / "0.png").write_bytes(b"x")
    before = digest(folder, cache)
    (folder / "train" / "a" / "1.png").write_bytes(b"y")  # an image added
    assert digest(folder, cache) != before
    assert digest(tmp_path / "missing", cache) is None and digest(None, cache) is None


def test_unchanged_files_are_not_read_again(tmp_path, monkeypatch):
    path = tmp_path / "archive.tar.gz"
    path.write_bytes(b"0" * 1000)
    cache = DigestCache(tmp_path / "digests.json")
    value = digest(path, cache)
    cache.save()
    reads = []
    import selcl.sources as S
    monkeypatch.setattr(S, "_sha256", lambda p: reads.append(p) or "x")
    assert digest(path, DigestCache(tmp_path / "digests.json")) == value and reads == []
    os.utime(path, ns=(1, 1))                            # touched: read again
    assert digest(path, DigestCache(tmp_path / "digests.json")) == "x" and reads == [path]


def test_symlinked_folders_are_followed_and_a_loop_ends(tmp_path):
    """The data stage reads images through symlinked folders (`train -> /mnt/...`), so the
    digest must see a change there too; a link back up the tree is read once."""
    cache = DigestCache(tmp_path / "digests.json")
    real = tmp_path / "elsewhere" / "a"
    real.mkdir(parents=True)
    (real / "0.png").write_bytes(b"x")
    folder = tmp_path / "images"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "a").symlink_to(real, target_is_directory=True)
    (real / "loop").symlink_to(folder / "train", target_is_directory=True)   # a -> ... -> a
    before = digest(folder, cache)
    (real / "0.png").write_bytes(b"y")                   # an image replaced behind the link
    assert digest(folder, cache) != before
