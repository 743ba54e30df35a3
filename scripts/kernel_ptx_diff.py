#!/usr/bin/env python3
"""Which kernels' code differs between two revisions, without a GPU.

Compiles a kernel module of each revision to PTX with nvcc for sm_90 - its
source as that revision's kernels package assembles it (KernelSource for the
default module; --module mid / few / absorb for the modules beside it, or
all; --module persist for revisions up to b36a736, the last with the
persistent MoE module), printed by a throwaway Go program built against the
revision's tree - and compares the kernels entry by entry after dropping what changes
with unrelated code (debug line info, comments, the module-wide numbering of
labels and local depots, where a static shared array is declared). A refactor that lists no kernel has not changed
what the device runs, so the last device checks of those kernels still hold;
a listed kernel needs its device check again.

    python3 scripts/kernel_ptx_diff.py d8895c1 main
    python3 scripts/kernel_ptx_diff.py main WORKTREE   # uncommitted edits
    python3 scripts/kernel_ptx_diff.py main WORKTREE --module all --strict

Needs git, go and nvcc (Debian: nvidia-cuda-toolkit from contrib/non-free,
11.8 is enough); --compiler nvrtc compiles with NVRTC instead, as the engine
does (TILERT_NVRTC=/opt/nvrtc12/libnvrtc.so.12; no PTX cache). Compiled PTX is kept by source hash in --cache (default
~/.cache/kernel_ptx_diff), so an unchanged side costs no compile. Exit
status 0 whether or not kernels differ (--strict: 1 when any does or is in
one revision only); 2 on usage or compile errors.
"""
import argparse
import difflib
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

# The modules whose source the kernels package assembles (kernels.go,
# kernels_mid.go, kernels_few.go, kernels_absorb.go): the function that
# returns each one's source. wg is sm_90a only (nvcc 12+). --module all
# compares these.
MODULES = {
    "main": "KernelSource",
    "mid": "MidKernelSource",
    "few": "FewKernelSource",
    "absorb": "AbsorbKernelSource",
}

# sm_90a-only modules, compared by name only (all leaves them out): wg
# (kernels_wg.go) needs --arch sm_90a --compiler nvrtc with NVRTC 12+.
ARCH_MODULES = {
    "wg": "WGKernelSource",
}

# Modules the kernels package no longer has, still comparable between older
# revisions (by name only: all leaves them out). persist: the persistent
# MoE kernel (moe_persist.go), removed in session 11; last in b36a736.
REMOVED_MODULES = {
    "persist": "PersistKernelSource",
}

# A throwaway main program printing one module's source, built against the
# revision's own tree so the revision's assembly (its headers, their order)
# is what gets compiled.
# With an argument (an arch, compute_XY) it prints the PTX that NVRTC
# (TILERT_NVRTC or the system's) builds from that source with the kernels
# package's options (kernelOptions), as the engine compiles it.
GO_MAIN = """package main

import (
\t"fmt"
\t"os"

\t"github.com/tilert-go/tilert/cuda"
\t"github.com/tilert-go/tilert/cuda/kernels"
)

func main() {
\tsrc := kernels.%s()
\tif len(os.Args) < 2 {
\t\tos.Stdout.WriteString(src)
\t\treturn
\t}
\tnv, err := cuda.LoadNVRTC()
\tif err != nil {
\t\tfmt.Fprintf(os.Stderr, "%%+v\\n", err)
\t\tos.Exit(1)
\t}
\tptx, err := nv.Compile(src, "module.cu", []string{"--gpu-architecture=" + os.Args[1], "--std=c++17", "-default-device", "-lineinfo"}, false)
\tif err != nil {
\t\tfmt.Fprintf(os.Stderr, "%%+v\\n", err)
\t\tos.Exit(1)
\t}
\tfmt.Fprintf(os.Stderr, "NVRTC %%s\\n", nv.Version())
\tos.Stdout.Write(ptx)
}
"""


class CompileError(Exception):
    pass


def source_func(module):
    return MODULES.get(module) or ARCH_MODULES.get(module) or REMOVED_MODULES[module]


def module_source(repo, rev, module, tmp, nvrtc_arch=None):
    """The module's source as the kernels package of rev assembles it (WORKTREE: the files on disk);
    with nvrtc_arch, the PTX NVRTC builds from it instead. None when rev's kernels package has no such
    module (its source function is undefined there: added later, or removed)."""
    root = os.path.abspath(repo)
    if rev != "WORKTREE":
        root = os.path.join(tmp, "tree-" + re.sub(r"\W", "_", rev))
        if not os.path.isdir(root):
            os.makedirs(root)
            tar = subprocess.run(["git", "-C", repo, "archive", rev, "go.mod", "go.sum", "cuda"], check=True,
                                 capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                t.extractall(root)
    prog = os.path.join(tmp, "source_%s.go" % module)
    with open(prog, "w", encoding="utf-8") as f:
        f.write(GO_MAIN % source_func(module))
    # A file named on go run's command line builds against the module of
    # the directory it runs in: the revision's tree.
    r = subprocess.run(["go", "run", prog] + ([nvrtc_arch] if nvrtc_arch else []), cwd=root, capture_output=True,
                       text=True)
    if r.returncode != 0 and "undefined: kernels.%s" % source_func(module) in r.stderr:
        return None
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise CompileError("go run failed assembling %s's %s module (the errors above)" % (rev, module))
    return r.stdout


def ptx(src, arch, tmp, tag, cache):
    """src compiled to PTX; cache (a directory or None) keeps each result under the hash of nvcc's
    version, arch and the source, so an unchanged revision is not compiled again (~1 minute a module)."""
    key = None
    if cache:
        ver = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        key = os.path.join(cache, hashlib.sha256((ver + "\0" + arch + "\0" + src).encode()).hexdigest() + ".ptx")
        if os.path.isfile(key):
            with open(key, encoding="utf-8") as f:
                return f.read()
    cu, px = os.path.join(tmp, tag + ".cu"), os.path.join(tmp, tag + ".ptx")
    with open(cu, "w", encoding="utf-8") as f:
        f.write(src)
    r = subprocess.run(["nvcc", "-arch=" + arch, "-std=c++17", "-ptx", "-o", px, cu], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise CompileError("nvcc failed on %s (the errors above): fix the kernels or pass a revision that compiles" % tag)
    with open(px, encoding="utf-8") as f:
        text = f.read()
    if key:
        os.makedirs(cache, exist_ok=True)
        with open(key + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(key + ".tmp", key)
    return text


def entries(text):
    text = re.sub(r"^\s*\.loc\b.*$", "", text, flags=re.M)
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)
    text = re.sub(r"__local_depot\d+", "__local_depot", text)
    text = re.sub(r"\n\s*(?=\n)", "", text)  # blank lines (where .loc lines were: -lineinfo numbers them per source line)
    # A static __shared__ array is declared at module scope while several kernels use it and inside the
    # kernel once only one does (removing a kernel that shared an inlined body moves it): each kernel's
    # declarations, wherever they stand, are compared by their text, appended to its entry in order
    # (module-scope ones first), not by their place.
    top = [(m.group(2), m.group(1)) for m in re.finditer(r"^(\.shared\s[^;\n]*?([\w$]+)(?:\[\d*\])?;)$", text, flags=re.M)]
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\(.*?\n\}\n", text, flags=re.S):
        body = m.group(0)
        local = re.findall(r"^\s*(\.shared\s[^;\n]*;)\n", body, flags=re.M)
        body = re.sub(r"^\s*\.shared\s[^;\n]*;\n", "", body, flags=re.M)
        used = [d for n, d in top if re.search(r"(?<![\w$])" + re.escape(n) + r"(?![\w$])", body)]
        out[m.group(1)] = body + "".join("shared: %s\n" % d for d in used + local)
    return out


def compare(args, module, tmp):
    """Prints one module's comparison; returns the differing kernels plus those only in one revision."""
    tag = "" if args.module == ["main"] else "[%s] " % module
    side = {}
    for rev, name in ((args.a, "a"), (args.b, "b")):
        if args.compiler == "nvrtc":
            text = module_source(args.repo, rev, module, tmp, args.arch.replace("sm_", "compute_"))
        else:
            src = module_source(args.repo, rev, module, tmp)
            text = None if src is None else ptx(src, args.arch, tmp, module + "_" + name, args.cache)
        side[name] = text
    if side["a"] is None and side["b"] is None:
        print("%sno such module in %s or %s" % (tag, args.a, args.b))
        return []
    # A module one revision lacks: all its kernels are only in the other.
    ea, eb = entries(side["a"] or ""), entries(side["b"] or "")
    diff = sorted(k for k in set(ea) & set(eb) if ea[k] != eb[k])
    count = {n: "no such module" if side[n] is None else "%d kernels" % len(e) for n, e in (("a", ea), ("b", eb))}
    print("%s%s: %s, %s: %s" % (tag, args.a, count["a"], args.b, count["b"]))
    print("%sonly in %s: %s" % (tag, args.a, " ".join(sorted(set(ea) - set(eb))) or "-"))
    print("%sonly in %s: %s" % (tag, args.b, " ".join(sorted(set(eb) - set(ea))) or "-"))
    print("%sdiffering: %s" % (tag, " ".join(diff) or "-"))
    print("%sidentical: %d" % (tag, len(set(ea) & set(eb)) - len(diff)))
    for k in args.show or []:
        if k in diff:
            sys.stdout.writelines(difflib.unified_diff(ea[k].splitlines(True), eb[k].splitlines(True),
                                                       "%s:%s" % (args.a, k), "%s:%s" % (args.b, k), n=2))
    return diff + sorted(set(ea) ^ set(eb))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="revision (or WORKTREE)")
    ap.add_argument("b", help="revision (or WORKTREE)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--module", action="append", choices=sorted(MODULES) + sorted(ARCH_MODULES) + sorted(REMOVED_MODULES) + ["all"],
                    help="module to compare (repeatable; all: every current one; default main, the default module)")
    ap.add_argument("--compiler", choices=["nvcc", "nvrtc"], default="nvcc",
                    help="nvrtc: NVRTC through the cuda package (TILERT_NVRTC=...libnvrtc.so.12), the engine's compiler")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "kernel_ptx_diff"),
                    help="directory keeping compiled PTX by source hash ('' for none)")
    ap.add_argument("--show", action="append", metavar="KERNEL",
                    help="print the normalised PTX diff of a differing kernel (repeatable)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when any kernel differs or is only in one revision")
    args = ap.parse_args()
    mods = args.module or ["main"]
    args.module = list(dict.fromkeys(x for m in mods for x in (list(MODULES) if m == "all" else [m])))
    tools = [("go", "the modules' sources are assembled by the kernels package: install Go")]
    if args.compiler == "nvcc":
        tools.append(("nvcc", "install a CUDA toolkit (Debian: add contrib non-free, apt-get install nvidia-cuda-toolkit)"))
    for tool, hint in tools:
        try:
            subprocess.run([tool, "version" if tool == "go" else "--version"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            print("%s not found: %s" % (tool, hint), file=sys.stderr)
            return 2
    changed = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for m in args.module:
                changed += compare(args, m, tmp)
        except subprocess.CalledProcessError as e:
            print("git archive failed: %s (is the revision spelled right?)" % e.stderr.decode().strip(), file=sys.stderr)
            return 2
        except CompileError as e:
            print(e, file=sys.stderr)
            return 2
    return 1 if args.strict and changed else 0


if __name__ == "__main__":
    sys.exit(main())
