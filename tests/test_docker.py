"""The container's pins mirror pyproject.toml (faiss-gpu for faiss-cpu), and run.sh
mounts the repo with all GPUs as the calling user."""
import os
import subprocess
from pathlib import Path

import pytest

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_container_pins_mirror_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"]) | {d for d in project["optional-dependencies"]["dev"]
                                           if d.startswith("pytest")}
    expected = {p.replace("faiss-cpu", "faiss-gpu") for p in pins}
    lines = [ln.strip() for ln in (ROOT / "docker" / "requirements-gpu.txt").read_text().splitlines()]
    assert {ln for ln in lines if ln and not ln.startswith("#")} == expected


def test_dockerfile_and_run_script():
    """The image has a C compiler (torch.compile), and the caches the stages write live in
    the mounted repository (writable, kept after the --rm container, git-ignored)."""
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert "/compile_cache/" in (ROOT / ".gitignore").read_text().split()
    assert docker.startswith("#") and "FROM nvidia/cuda:12" in docker
    for needle in ("ARG UID", "ARG GID", "safe.directory", "DVC_SITE_CACHE_DIR=/workspace",
                   "requirements-gpu.txt", "git", "build-essential",
                   "TORCHINDUCTOR_CACHE_DIR=/workspace/compile_cache/"):
        assert needle in docker, needle
    run = (ROOT / "docker" / "run.sh").read_text()
    for needle in ("--gpus", "--ipc=host", "id -u", "/workspace"):
        assert needle in run, needle


def test_make_in_the_container_uses_the_image_environment():
    """docker/run.sh make paper: /opt/venv's dvc and python, never the host's .venv
    (mounted with the repo, its interpreter does not exist in the image)."""
    import os
    import subprocess
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert "SELCL_CONTAINER=1" in docker and "VIRTUAL_ENV=/opt/venv" in docker
    env = dict(os.environ, SELCL_CONTAINER="1", VIRTUAL_ENV="/opt/venv")
    for target in ("paper", "demo", "test", "gpu-check"):
        out = subprocess.run(["make", "-n", target], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout
        assert "/opt/venv/bin/" in out and ".venv" not in out.replace("/opt/venv", ""), out
        assert "pip install" not in out, out


def test_run_sh_passes_the_hosts_selcl_switches_into_the_container(tmp_path):
    """SELCL_NPROC=4 docker/run.sh dvc repro must reach torchrun inside: run.sh forwards
    every SELCL_* switch set on the host (by name, `-e VAR`), but not its own SELCL_IMAGE /
    SELCL_GPUS, nor SELCL_CONTAINER, which the image sets."""
    import os
    import subprocess
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELCL_")}
    env.update(PATH=f"{tmp_path}:{env['PATH']}", SELCL_NPROC="4", SELCL_COMPILE="0",
               SELCL_IMAGE="myimage", SELCL_GPUS="device=1", SELCL_CONTAINER="1")
    args = subprocess.run(["bash", str(ROOT / "docker" / "run.sh"), "dvc", "repro"], env=env,
                          capture_output=True, text=True, check=True).stdout.split("\n")
    passed = {args[i + 1] for i, a in enumerate(args) if a == "-e"}
    assert passed == {"CUDA_VISIBLE_DEVICES", "SELCL_NPROC", "SELCL_COMPILE"}, args
    assert "myimage" in args and "device=1" in args and args[-3:-1] == ["dvc", "repro"]


# --- The Dockerfile's user setup, run with the real shadow tools -------------------------

SEED = ROOT / "tests" / "fixtures" / "ubuntu-24.04"
SHADOW_TOOLS = ("useradd", "groupadd", "userdel", "groupdel", "usermod", "groupmod")
# What the user-setup RUN may call besides the shadow tools and getent: anything else could
# touch this machine's own files when the test runs it.
HARMLESS = {"cut", "[", "test", "true", "echo"}


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments and
    parser directives dropped (what `docker build` parses)."""
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue                                  # comments may sit inside a continuation
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1]                 # docker drops the `\` and the newline
            continue
        current += line
        if current.strip():
            keyword, _, args = current.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
        current = ""
    return out


def user_setup(dockerfile: Path) -> tuple[list[str], str, dict]:
    """The Dockerfile's own user setup: its SHELL, the one RUN that calls `useradd`, and
    the ARG defaults (the values `docker build` gives it without --build-arg)."""
    import json
    instructions = dockerfile_instructions(dockerfile.read_text())
    shells = [json.loads(args) for kw, args in instructions if kw == "SHELL"]
    runs = [args for kw, args in instructions if kw == "RUN" and "useradd" in args]
    assert len(runs) == 1, f"{dockerfile}: expected one RUN with useradd, found {len(runs)}"
    args = dict(a.partition("=")[::2] for kw, a in instructions if kw == "ARG")
    return (shells[-1] if shells else ["/bin/sh", "-c"]), runs[0], args


def _shims(bin_dir: Path, root: Path) -> None:
    """Put the real shadow tools on PATH with `--prefix root` (they then read and write
    root/etc/passwd, group, shadow, gshadow, use root/etc/login.defs and make homes under
    root/home), and a `getent` that looks up root/etc/<db> as the real one looks up /etc."""
    import shutil
    bin_dir.mkdir()
    for tool in SHADOW_TOOLS:
        real = shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
        if real:
            (bin_dir / tool).write_text(f'#!/bin/sh\nexec {real} --prefix "{root}" "$@"\n')
            (bin_dir / tool).chmod(0o755)
    (bin_dir / "getent").write_text(GETENT.replace("ETC", str(root / "etc")))
    (bin_dir / "getent").chmod(0o755)


# getent DB KEY: the first entry whose name or numeric id is KEY; exit 2 when none (getent(1))
GETENT = """#!/bin/sh
awk -F: -v key="$2" '$1 == key || $3 == key { print; found = 1; exit } END { exit found ? 0 : 2 }' "ETC/$1"
"""


def _as_root(root: Path) -> list[str]:
    """The prefix that runs a command as root: none for root; otherwise fakeroot, whose
    faked ownership is kept in `root`'s state file from one call to the next."""
    if os.geteuid() == 0:
        return []
    state = root.parent / f"fakeroot-{root.name}"
    return ["fakeroot", *(["-i", str(state)] if state.exists() else []), "-s", str(state), "--"]


def run_user_setup(dockerfile: Path, root: Path, uid: int, gid: int) -> subprocess.CompletedProcess:
    """Seed `root` with the base image's account files (its `ubuntu` home owned by 1000:1000,
    as there) and run the Dockerfile's user-setup RUN in its SHELL with UID/GID set, as
    `docker build --build-arg UID=uid --build-arg GID=gid` does (as root, or under fakeroot)."""
    import shutil
    shell, command, _ = user_setup(dockerfile)
    shutil.copytree(SEED / "etc", root / "etc")
    (root / "home" / "ubuntu").mkdir(parents=True)
    (root / "home" / "ubuntu" / ".bashrc").write_text("# ubuntu's\n")
    (root / "var" / "mail").mkdir(parents=True)
    subprocess.run([*_as_root(root), "chown", "-R", "1000:1000", str(root / "home" / "ubuntu")], check=True)
    bin_dir = root.parent / f"bin-{root.name}"
    _shims(bin_dir, root)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "UID": str(uid), "GID": str(gid), "LC_ALL": "C"}
    return subprocess.run([*_as_root(root), *shell, command], env=env, capture_output=True, text=True)


def _owner(root: Path, path: Path) -> tuple[int, int]:
    """uid and gid of `path` as the user setup left them (under fakeroot: as it faked them)."""
    out = subprocess.run([*_as_root(root), "stat", "-c", "%u %g", str(path)], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), int(out[1])


def _entries(root: Path, db: str) -> list[list[str]]:
    return [ln.split(":") for ln in (root / "etc" / db).read_text().splitlines() if ln]


def _need_shadow_tools():
    import shutil
    if os.geteuid() != 0 and not shutil.which("fakeroot"):
        pytest.skip("the shadow tools need root (useradd chowns the new home): run as root, or install fakeroot")
    missing = [t for t in ("useradd", "groupadd", "userdel")
               if not shutil.which(t, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")]
    if missing:
        pytest.skip(f"no {', '.join(missing)} on this machine (Debian/Ubuntu package `passwd`)")


def test_the_getent_stand_in_answers_as_getent(tmp_path):
    """The shim looks entries up as the real getent does, checked on this machine's /etc."""
    import shutil
    if not shutil.which("getent"):
        pytest.skip("no getent on this machine")
    shim = tmp_path / "getent"
    shim.write_text(GETENT.replace("ETC", "/etc"))
    shim.chmod(0o755)
    for args in (["passwd", "0"], ["passwd", "root"], ["group", "0"], ["group", "root"],
                 ["passwd", "54321"], ["group", "no-such-group"]):
        real = subprocess.run(["getent", *args], capture_output=True, text=True)
        ours = subprocess.run([str(shim), *args], capture_output=True, text=True)
        assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout), args


def commands_called(command: str) -> set[str]:
    """The command names of a shell command line: the first word of every simple command
    (after `;`, `&&`, `||`, `|`, `(`, `$(`, `if`, `then`, `!`, ...), assignments skipped."""
    import shlex
    # quotes dropped: a command substitution inside "..." is a command too
    lexer = shlex.shlex(command.replace("\"", " ").replace("$(", " ( "), posix=True, punctuation_chars=True)
    names, at_start = set(), True
    for token in lexer:
        if token in (";", "&&", "||", "|", "(", ")", ">", "<") or token in ("if", "then", "else", "fi", "!"):
            at_start = token not in (")", ">", "<")
            continue
        if at_start and "=" not in token:
            names.add(token)
        at_start = False
    return names


def test_the_user_setup_runs_only_account_commands():
    """The RUN this test executes on this machine calls nothing but the shadow tools,
    getent and shell built-ins: nothing outside the seeded root is touched."""
    shell, command, args = user_setup(ROOT / "docker" / "Dockerfile")
    assert {"UID", "GID"} <= set(args) and shell[0] == "/bin/bash", (shell, args)
    assert commands_called(command) <= set(SHADOW_TOOLS) | {"getent"} | HARMLESS, commands_called(command)
    assert commands_called('a="$(getent passwd 1 | cut -d: -f1)" && git config; (x || rm -rf y)') \
        == {"getent", "cut", "git", "x", "rm"}


@pytest.mark.parametrize("uid,gid", [(1000, 1000), (1001, 1001), (1000, 100), (501, 20)])
def test_the_dockerfile_user_setup_works_on_the_ubuntu_base(tmp_path, uid, gid):
    """For the build-arg defaults (1000:1000, the base image's own `ubuntu`), a fresh UID
    and GID, an existing group (100 `users`) and macOS's 501:20 (`dialout` here): the image
    ends with exactly one user of UID, named selcl, in group GID, with its own home and
    bash, and the account files stay consistent."""
    _need_shadow_tools()
    root = tmp_path / "root"
    proc = run_user_setup(ROOT / "docker" / "Dockerfile", root, uid, gid)
    assert proc.returncode == 0, f"UID={uid} GID={gid}: {proc.stderr.strip()}"
    passwd, group = _entries(root, "passwd"), _entries(root, "group")
    holders = [e for e in passwd if e[2] == str(uid)]
    assert [e[0] for e in holders] == ["selcl"], holders
    assert holders[0][3] == str(gid) and holders[0][5:] == ["/home/selcl", "/bin/bash"], holders
    assert [e[2] for e in group].count(str(gid)) == 1, group        # the group exists, once
    assert len({e[2] for e in passwd}) == len(passwd) and len({e[2] for e in group}) == len(group)
    home = root / "home" / "selcl"
    assert home.is_dir() and _owner(root, home) == (uid, gid)
    # the shadow files follow passwd and group, entry for entry
    assert [e[0] for e in _entries(root, "shadow")] == [e[0] for e in passwd]
    assert [e[0] for e in _entries(root, "gshadow")] == [e[0] for e in group]
    ubuntu_kept = uid != 1000
    assert any(e[0] == "ubuntu" for e in passwd) is ubuntu_kept
    assert (root / "home" / "ubuntu").exists() is ubuntu_kept
    if not ubuntu_kept:   # no group lists the deleted user as a member
        assert not any("ubuntu" in e[3].split(",") for e in group), group


# --- .dockerignore: the build context stays small whatever the pipeline has written ------

def dockerignore_patterns(text: str) -> list[tuple[bool, "re.Pattern"]]:
    """(exclude?, regex) per line of a .dockerignore, as docker reads it: comments and blank
    lines dropped, `!` re-includes, a leading `/` is the context root, Go's filepath.Match
    wildcards (`*`, `?` within one path element) and docker's `**` (any number of them)."""
    import re
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rx = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                rx += ".*"
                i += 2
                if pattern.startswith("/", i):   # `**/` also matches no folder at all
                    rx += "/?" if rx != ".*" else ""
                    i += 1
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        out.append((exclude, re.compile(rx + r"\Z")))
    return out


def build_context(root: Path, patterns) -> dict[str, int]:
    """The files `docker build root` sends, with their sizes: a file is left out when the
    last pattern that matches it or one of its parent folders excludes it (moby's
    patternmatcher); symbolic links are sent as links, never followed."""
    sent = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            parts = rel.split("/")
            prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
            excluded = False
            for exclude, rx in patterns:
                if any(rx.match(p) for p in prefixes) if exclude else rx.match(rel):
                    excluded = exclude
            if not excluded:
                sent[rel] = path.lstat().st_size
    return sent


def pipeline_outputs() -> list[str]:
    """Every path the pipeline and the tools write: dvc.yaml's outputs, metrics and plots
    (for one setting), what git ignores (the venv, DVC's cache and temp folder, data/,
    scratch/, demo/, compile_cache/, ...), and git's own folder."""
    import yaml
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    paths = []
    for stage in stages.values():
        for key in ("outs", "metrics", "plots"):
            for entry in stage.get("do", stage).get(key, []):
                paths.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    paths = [p.replace("${item}", "demo_sym40").replace("${key}", "demo") for p in paths]
    for line in (ROOT / ".gitignore").read_text().splitlines():
        line = line.strip().strip("/")
        if line and not line.startswith("#"):
            paths.append(line.replace("*", "x"))
    return sorted(set(paths) | {".git/objects/pack/pack-1.pack", ".dvc/cache/files/md5/ab/cdef",
                                ".dvc/tmp/site_cache/x", "compile_cache/inductor/x", "data/raw/cifar.tgz"})


def test_dockerignore_leaves_only_what_the_image_copies(tmp_path):
    """A copy of the repository's tracked files with a 50 MB (sparse) file at every output
    path the pipeline writes: the build context is the Dockerfile's COPY sources and
    nothing large, and each COPY source is in it (else the build fails)."""
    import shutil
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tree = tmp_path / "repo"
    for rel in tracked.split():
        if (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, tree / rel)
    outputs = pipeline_outputs()
    assert {".venv", "data", "scratch", "demo", ".dvc/cache", ".dvc/tmp", "compile_cache"} <= set(outputs)
    for rel in outputs:
        path = tree / rel
        if path.is_dir() or not path.suffix or rel.endswith("config"):   # a folder: a file in it
            path = path / "output.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.truncate(50 << 20)
    patterns = dockerignore_patterns((ROOT / ".dockerignore").read_text())
    sent = build_context(tree, patterns)
    copies = [args.split()[-2] for kw, args in dockerfile_instructions((ROOT / "docker" / "Dockerfile").read_text())
              if kw in ("COPY", "ADD")]
    assert copies and all(c in sent for c in copies), (copies, sorted(sent))
    assert sum(sent.values()) < 1 << 20, sorted(sent, key=sent.get)[-5:]
    # without the file the same tree would send it all: the check sees what it guards against
    assert sum(build_context(tree, []).values()) > len(outputs) * (50 << 20) * 0.9


def test_the_dockerignore_reader_follows_docker():
    """Cases from docker's documentation of .dockerignore."""
    def sent(lines, path):
        return path in build_context_of([path], dockerignore_patterns("\n".join(lines)))

    def build_context_of(paths, patterns):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            for p in paths:
                (Path(d) / p).parent.mkdir(parents=True, exist_ok=True)
                (Path(d) / p).write_text("x")
            return build_context(Path(d), patterns)
    assert not sent(["*/temp*"], "somedir/temporary.txt") and sent(["*/temp*"], "somedir/sub/temp.txt")
    assert not sent(["*/*/temp*"], "somedir/subdir/temporary.txt")
    assert not sent(["temp?"], "tempa") and sent(["temp?"], "tempab")
    assert not sent(["**/*.go"], "a/b/c.go") and not sent(["**/*.go"], "c.go")
    assert sent(["*.md", "!README.md"], "README.md") and not sent(["*.md", "!README.md"], "x.md")
    assert not sent(["*.md", "!README*.md", "README-secret.md"], "README-secret.md")
    assert not sent([".venv"], ".venv/bin/python") and sent([".venv"], "venv/x")
    assert not sent(["/data/"], "data/raw/x.tgz")
