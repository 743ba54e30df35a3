"""scripts/ncu_stalls.py: ncu's SASS source page (CSV) summarised by stall reason and instruction.

The CSVs here are written by hand in ncu's layout (a "Kernel Name" line, a header, a line per
instruction), so the tests run anywhere; docs/measured/h200-2026-12-04-s24/callB holds real ones.
"""

import contextlib
import importlib.util
import io
import lzma
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ncu_stalls", ROOT / "scripts" / "ncu_stalls.py")
ns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ns)

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"stall_long_sb","stall_wait","stall_barrier","stall_long_sb (Not Issued)"')


def section(name, rows):
    lines = ['"Kernel Name","%s",' % name, HEADER]
    for addr, src, lsb, wait, bar in rows:
        lines.append('"%s","%s","%d","%d","%d","%d","%d","%d"' % (addr, src, lsb + wait + bar, lsb, lsb, wait, bar, lsb))
    return "\n".join(lines) + "\n"


SCORES = [("0x10", "LDG.E.128 R4, [R2]", 0, 1, 0), ("0x20", "FMUL R7, R7, R36", 30, 2, 0),
          ("0x30", "HMMA.16816.F32 R8, R12, R16, R8", 1, 6, 0), ("0x40", "@P0 EXIT", 0, 0, 5)]
TOPK = [("0x10", "BSSY B0", 0, 0, 9), ("0x20", "ISETP.GE.AND P5", 4, 0, 0)]


def run(text, *args, tmp_path):
    p = tmp_path / "sass.csv"
    p.write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = ns.main([str(p), *args])
    return rc, out.getvalue()


def test_reasons_and_top_instructions(tmp_path):
    # ncu prints a kernel's section twice: counted once.
    text = section("scores", SCORES) + section("scores", SCORES) + section("topk", TOPK)
    rc, out = run(text, "--top", "2", tmp_path=tmp_path)
    assert rc == 0
    assert "scores: 45 stall samples over 4 instructions\n" in out
    reasons = {ln.split()[0]: int(ln.split()[1]) for ln in out.split("top instructions")[0].splitlines()[1:] if ln.strip()}
    assert reasons == {"long_sb": 31, "wait": 9, "barrier": 5}  # the repeated section not doubled
    first = out.split("top instructions")[1].splitlines()[1]
    assert "FMUL R7, R7, R36" in first and "long_sb=30" in first
    assert "EXIT" not in out.split("topk:")[0]  # --top 2 keeps FMUL and HMMA
    assert "topk: 13 stall samples over 2 instructions" in out


def test_kernel_filter_and_other_launches(tmp_path):
    other = [(a, s, l + 1, w, b) for a, s, l, w, b in SCORES]
    text = section("scores", SCORES) + section("scores", other) + section("topk", TOPK)
    rc, out = run(text, "--kernel", "scor", tmp_path=tmp_path)
    assert rc == 0
    assert "topk" not in out
    assert "(1 other launches' sections not counted)" in out


def test_xz_input(tmp_path):
    p = tmp_path / "sass.csv.xz"
    with lzma.open(p, "wt") as f:
        f.write(section("topk", TOPK))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ns.main([str(p)]) == 0
    assert "barrier" in out.getvalue()


@pytest.mark.parametrize("text", ["", "a,b\n1,2\n"])
def test_not_a_source_page(tmp_path, text, capsys):
    p = tmp_path / "x.csv"
    p.write_text(text)
    assert ns.main([str(p)]) == 2
    assert "--page source --csv --print-source sass" in capsys.readouterr().err


def test_missing_samples_column(tmp_path, capsys):
    p = tmp_path / "x.csv"
    p.write_text('"Kernel Name","k",\n"Address","Source"\n"0x10","NOP"\n')
    assert ns.main([str(p)]) == 2
    assert "Warp Stall Sampling" in capsys.readouterr().err
