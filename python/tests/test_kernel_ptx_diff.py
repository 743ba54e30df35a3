"""scripts/kernel_ptx_diff.py's comparison: what it treats as the same kernel and what as a change.

The nvcc run itself needs a CUDA toolkit; these tests feed PTX text straight to entries() and fake
nvcc for the PTX cache, so they run anywhere.
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kernel_ptx_diff", ROOT / "scripts" / "kernel_ptx_diff.py")
kpd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kpd)

KERNEL = """.visible .entry {name}(
\t.param .u64 p0
)
{{
\t.local .align 4 .b8 \t__local_depot{depot}[16];
\t.loc 1 {line} 3
// a comment
\t@%p1 bra \t$L__BB{bb}_2;
\tadd.f32 \t%f1, %f2, %f{reg};
$L__BB{bb}_2:
\tret;
}}
"""


def ptx(**kw):
    base = dict(name="k", depot=0, line=10, bb=0, reg=3)
    base.update(kw)
    return KERNEL.format(**base)


def test_renumbering_and_line_info_are_not_changes():
    a = kpd.entries(ptx(depot=1, line=10, bb=4) + ptx(name="other"))
    b = kpd.entries(ptx(name="other", bb=9) + ptx(depot=7, line=99, bb=12))
    assert sorted(a) == ["k", "other"]
    assert a == b


def test_line_info_lines_of_any_count_are_not_changes():
    """-lineinfo (NVRTC) numbers code per source line: a macro's body is one line, a function's many."""
    a = kpd.entries(ptx())
    b = kpd.entries(ptx().replace("\tret;", "\t.loc 1 11 3\n\n\t.loc 1 12 3\n\tret;"))
    assert a == b


def test_an_instruction_change_is_a_change():
    a = kpd.entries(ptx())
    b = kpd.entries(ptx(reg=4))
    assert a["k"] != b["k"]


def test_every_module_names_its_go_source_function():
    """Each module's source comes from the kernels package's own assembly (its headers, their order)."""
    kernels_go = "".join(p.read_text() for p in (ROOT / "cuda" / "kernels").glob("*.go") if not p.name.endswith("_test.go"))
    assert kpd.MODULES["main"] == "KernelSource"
    for mod, fn in kpd.MODULES.items():
        assert "func %s() string" % fn in kernels_go, (mod, fn)
        assert "kernels.%s()" % fn in kpd.GO_MAIN % fn


def test_the_cache_key_is_the_source(tmp_path, monkeypatch):
    """A cached PTX is reused for the same source only: another source compiles again."""
    calls = []

    def fake_run(cmd, **kw):
        class R:
            returncode = 0
            stdout = "nvcc 11.8"
            stderr = ""

        if "-ptx" in cmd:
            calls.append(cmd)
            out = cmd[cmd.index("-o") + 1]
            src = open(cmd[-1]).read()
            open(out, "w").write("PTX of " + src)
        return R()

    monkeypatch.setattr(kpd.subprocess, "run", fake_run)
    cache = str(tmp_path / "cache")
    assert kpd.ptx("A", "sm_90", str(tmp_path), "a", cache) == "PTX of A"
    assert kpd.ptx("A", "sm_90", str(tmp_path), "b", cache) == "PTX of A"
    assert kpd.ptx("B", "sm_90", str(tmp_path), "c", cache) == "PTX of B"
    assert len(calls) == 2
