"""Compiles nanhunt's torch-facing sources (the plugin and the LibTorch test
programs) against the headers of older torch releases, so that the same
sources keep building on a machine with another torch 2.x (a GPU machine,
a user's environment). Where torch's C++ interface moved,
interpose/torch/torch_compat.h chooses by version; each release below
takes another of its branches:

  2.4.1  the oldest release checked: no RecordFunction::overload_name()
         (2.7), no getStreamNativeHandle() (2.11)
  2.7.1  overload_name(), no getStreamNativeHandle()

The pinned torch (requirements.txt) takes the newest branch in every build.
Each file is compiled with its own command from build/compile_commands.json
(scripts/build.sh), the pinned torch's include folders swapped for the
release's, and -fsyntax-only: the check is the compiler's, nothing links
(those wheels' C++ ABI is another story: cmake/Torch.cmake). The headers
come from the release's wheel on PyPI, unpacked once into
~/.cache/nanhunt/torch-headers (about 800 MB downloaded per release).

Prints a line per release and exits 1 when any file does not compile.
`scripts/torch_headers_check.py 2.5.1 2.9.0` checks those releases instead."""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ["2.4.1", "2.7.1"]


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nanhunt" / "torch-headers"


def headers(release):
    """The folder holding torch/include of `release`, unpacked from its wheel
    the first time."""
    folder = cache_dir() / release
    if (folder / "torch" / "include" / "ATen" / "ATen.h").exists():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"torch=={release}",
             "--only-binary=:all:", "--python-version", "3.11",
             "--platform", "manylinux1_x86_64", "--platform", "manylinux_2_28_x86_64",
             "-d", tmp], check=True)
        [wheel] = Path(tmp).glob("torch-*.whl")
        partial = folder.with_name(folder.name + ".partial")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial, [n for n in z.namelist()
                                   if n.startswith("torch/include/") or n == "torch/version.py"])
        partial.rename(folder)
    return folder


def pinned_torch():
    out = subprocess.run(
        [sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
        capture_output=True, text=True, check=True)
    return out.stdout.strip()


def torch_commands(build):
    """(source, argv) of each compile command that includes the pinned torch."""
    include = f"{pinned_torch()}/include"
    entries = json.loads((build / "compile_commands.json").read_text())
    for e in entries:
        if include in e["command"]:
            yield e["file"], e["directory"], shlex.split(e["command"]), include


def syntax_only(argv, pinned_include, release_include):
    """The command for `-fsyntax-only` against the release's headers."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("-MF") or a in ("-MD", "-MMD", "-MT", "-MQ"):
            skip = a in ("-MT", "-MQ", "-MF")
            continue
        out.append(a.replace(pinned_include, release_include))
    return out + ["-fsyntax-only"]


def check(release, build):
    release_include = str(headers(release) / "torch" / "include")
    jobs = []
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for source, directory, argv, pinned_include in torch_commands(build):
            cmd = syntax_only(argv, pinned_include, release_include)
            jobs.append((source, pool.submit(subprocess.run, cmd, cwd=directory,
                                             capture_output=True, text=True)))
        failed = []
        for source, job in jobs:
            r = job.result()
            if r.returncode != 0:
                failed.append(source)
                errors = [line for line in r.stderr.splitlines() if "error" in line]
                print(f"  {Path(source).relative_to(ROOT)}:", *errors[:10], sep="\n    ")
    return len(jobs), failed


def main():
    build = ROOT / "build"
    if not (build / "compile_commands.json").exists():
        sys.exit("torch_headers_check: build/compile_commands.json is missing: run scripts/build.sh")
    ok = True
    for release in sys.argv[1:] or RELEASES:
        n, failed = check(release, build)
        if n == 0:
            sys.exit("torch_headers_check: no compile command includes the pinned torch")
        print(f"torch {release}: {n - len(failed)} of {n} torch-facing files compile")
        ok = ok and not failed
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
