"""scripts/kernel_ptx_diff.py's comparison: what it treats as the same kernel and what as a change.

The nvcc run itself needs a CUDA toolkit; these tests feed PTX text straight to entries() and the
module assembly, so they run anywhere.
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


def test_an_instruction_change_is_a_change():
    a = kpd.entries(ptx())
    b = kpd.entries(ptx(reg=4))
    assert a["k"] != b["k"]


def test_module_order_is_kernel_source_order():
    src = kpd.module({"b.cu": "B", "common.cuh": "C", "a.cu": "A"})
    assert src.index("C") < src.index("A") < src.index("B")
    assert '#line 1 "a.cu"' in src
