#!/usr/bin/env python3
"""Which kernels' code differs between two revisions, without a GPU.

Compiles the embedded kernel module (cuda/kernels/cu: common.cuh, then every
.cu in name order, as kernels.KernelSource does) of each revision to PTX with
nvcc for sm_90, and compares the kernels entry by entry after dropping what
changes with unrelated code (debug line info, comments, the module-wide
numbering of labels and local depots). A refactor that lists no default-path
kernel has not changed what the device runs, so the last device checks of
those kernels still hold; a listed kernel needs its device check again.

    python3 scripts/kernel_ptx_diff.py d8895c1 main
    python3 scripts/kernel_ptx_diff.py main WORKTREE   # uncommitted edits

Needs git and nvcc (Debian: nvidia-cuda-toolkit from contrib/non-free, 11.8
is enough). Exit status 0 whether or not kernels differ; 2 on usage or
compile errors.
"""
import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

KDIR = "cuda/kernels/cu"


class CompileError(Exception):
    pass


def sources(repo, rev):
    """common.cuh and the .cu files of rev (WORKTREE: the files on disk), cu/ only (as kernels.KernelSource)."""
    files = {}
    if rev == "WORKTREE":
        d = os.path.join(repo, KDIR)
        for n in os.listdir(d):
            if not os.path.isfile(os.path.join(d, n)):
                continue  # cu/wg/: the sm_90a module, not the main one
            with open(os.path.join(d, n), encoding="utf-8") as f:
                files[n] = f.read()
        return files
    tar = subprocess.run(["git", "-C", repo, "archive", rev, KDIR], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t.getmembers():
            if m.isfile() and os.path.dirname(m.name) == KDIR:  # cu/*: the main module (cu/wg/ is the sm_90a one)
                files[os.path.basename(m.name)] = t.extractfile(m).read().decode("utf-8")
    return files


def module(files):
    out = ['#line 1 "common.cuh"\n', files["common.cuh"]]
    for n in sorted(k for k in files if k.endswith(".cu")):
        out += ['\n#line 1 "%s"\n' % n, files[n]]
    return "".join(out)


def ptx(src, arch, tmp, tag):
    cu, px = os.path.join(tmp, tag + ".cu"), os.path.join(tmp, tag + ".ptx")
    with open(cu, "w", encoding="utf-8") as f:
        f.write(src)
    r = subprocess.run(["nvcc", "-arch=" + arch, "-std=c++17", "-ptx", "-o", px, cu], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise CompileError("nvcc failed on %s (the errors above): fix the kernels or pass a revision that compiles" % tag)
    with open(px, encoding="utf-8") as f:
        return f.read()


def entries(text):
    text = re.sub(r"^\s*\.loc\b.*$", "", text, flags=re.M)
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)
    text = re.sub(r"__local_depot\d+", "__local_depot", text)
    return {m.group(1): m.group(0) for m in re.finditer(r"\.entry\s+(\w+)\(.*?\n\}\n", text, flags=re.S)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="revision (or WORKTREE)")
    ap.add_argument("b", help="revision (or WORKTREE)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    try:
        subprocess.run(["nvcc", "--version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print("nvcc not found: install a CUDA toolkit (Debian: add contrib non-free, apt-get install nvidia-cuda-toolkit)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ea = entries(ptx(module(sources(args.repo, args.a)), args.arch, tmp, "a"))
            eb = entries(ptx(module(sources(args.repo, args.b)), args.arch, tmp, "b"))
        except subprocess.CalledProcessError as e:
            print("git archive failed: %s (is the revision spelled right?)" % e.stderr.decode().strip(), file=sys.stderr)
            return 2
        except CompileError as e:
            print(e, file=sys.stderr)
            return 2
    diff = sorted(k for k in set(ea) & set(eb) if ea[k] != eb[k])
    print("%s: %d kernels, %s: %d kernels" % (args.a, len(ea), args.b, len(eb)))
    print("only in %s: %s" % (args.a, " ".join(sorted(set(ea) - set(eb))) or "-"))
    print("only in %s: %s" % (args.b, " ".join(sorted(set(eb) - set(ea))) or "-"))
    print("differing: %s" % (" ".join(diff) or "-"))
    print("identical: %d" % (len(set(ea) & set(eb)) - len(diff)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
