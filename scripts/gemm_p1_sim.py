#!/usr/bin/env python3
"""Lane-level simulation of cuda/kernels/cu/gemm_p1.cu (gemm_p1_tile): the K permutation of
gemm_split_p1, the loaders' shared-memory addresses, the 4-stage ring (sequential in time), the
ldmatrix / mma.m16n8k16 fragment layouts as PTX defines them, the per-128-K promotion and the epilogue,
against the exact product on small integer inputs (tails in M, N and K, expert row maps). No GPU;
needs numpy. Run after changing the kernel's index math: python3 scripts/gemm_p1_sim.py
"""
import numpy as np
rng = np.random.default_rng(1)
GP_BN, GP_BK, GP_ALD, GP_BLD, GP_ST = 128, 64, 72, 64, 4

def phys(c):
    cc = c & 63; s = cc >> 4; L = cc & 15
    return (c & ~63) + 16*((L & 7) >> 1) + 4*s + 2*(L >> 3) + (L & 1)

def run(MT, M, N, K, xrows=None, start=0, rows=None, n0=0):
    BM = 32*MT
    W = rng.integers(-8, 9, size=(N, K)).astype(np.float64)
    KB = (K + 127) >> 7
    S = rng.integers(1, 5, size=((N+127)//128, KB)).astype(np.float64)
    X = rng.integers(-8, 9, size=(M, K)).astype(np.float64)
    Kp = (K + 63)//64*64
    xs = np.zeros((M, Kp))
    for c in range(Kp):
        k = phys(c)
        if k < K: xs[:, c] = X[:, k]
    SA = BM*GP_ALD*2; SB = SA + GP_BN*GP_BLD
    smem = np.full(GP_ST*SB, np.nan)  # one float per byte address (A halves stored at even byte addr)
    if rows is None: rows = min(BM, M - start)
    asrc, abytes = [], []
    for tid in range(256):
        a, b = [], []
        for i in range(MT):
            r = (tid >> 3) + 32*i
            ok = r < rows
            row = (xrows[start + r] if xrows is not None else start + r) if ok else 0
            a.append((row, (tid & 7)*8)); b.append(16 if ok else 0)
        asrc.append(a); abytes.append(b)
    def issue(st, k0):
        S0 = st*SB
        for tid in range(256):
            a_dst = ((tid >> 3)*GP_ALD + (tid & 7)*8)*2
            for i in range(MT):
                d = S0 + a_dst + i*(32*GP_ALD*2)
                row, col = asrc[tid][i]
                for e in range(8):
                    smem[d + 2*e] = xs[row, k0 + col + e] if abytes[tid][i] else 0.0
            b_dst = SA + (tid >> 2)*GP_BLD + (tid & 3)*16
            bkc0 = (tid & 3)*16
            for i in range(2):
                n = n0 + (tid >> 2) + 64*i
                ok = n < N and k0 + bkc0 < K
                d = S0 + b_dst + i*(64*GP_BLD)
                for e in range(16):
                    smem[d + e] = W[n, k0 + bkc0 + e] if ok else 0.0
    acc = np.zeros((8, 32, MT, 4, 4)); part = np.zeros_like(acc)
    nk = Kp // GP_BK
    for s in range(GP_ST - 1):
        if s < nk: issue(s, s*GP_BK)
    def tile(t, first):
        if t + GP_ST - 1 < nk: issue((t + GP_ST - 1) % GP_ST, (t + GP_ST - 1)*GP_BK)
        st = (t % GP_ST)*SB
        for warp in range(8):
            wm, wn = warp >> 2, warp & 3
            # per-lane registers
            braw = np.zeros((32, 4, 16))
            for lane in range(32):
                g, t4 = lane >> 2, lane & 3
                b_off = SA + (wn*32 + g)*GP_BLD + 16*t4
                for j in range(4):
                    base = st + b_off + j*8*GP_BLD
                    braw[lane, j] = smem[base:base+16]
            for s in range(4):
                for i in range(MT):
                    # ldmatrix x4: lane l gives the row address of matrix l//8, row l%8
                    addr = [st + ((wm*(BM//2) + (l & 15))*GP_ALD + (l >> 4)*8)*2 + (i*16*GP_ALD + s*16)*2 for l in range(32)]
                    mats = [[smem[addr[q*8 + r]: addr[q*8 + r] + 16: 2] for r in range(8)] for q in range(4)]
                    A = np.zeros((16, 16))
                    for lane in range(32):
                        g, t4 = lane >> 2, lane & 3
                        for e in range(2):
                            A[g, 2*t4+e] = mats[0][g][2*t4+e]
                            A[g+8, 2*t4+e] = mats[1][g][2*t4+e]
                            A[g, 2*t4+8+e] = mats[2][g][2*t4+e]
                            A[g+8, 2*t4+8+e] = mats[3][g][2*t4+e]
                    for j in range(4):
                        B = np.zeros((16, 8))
                        for lane in range(32):
                            g, t4 = lane >> 2, lane & 3
                            w = braw[lane, j, 4*s:4*s+4]
                            B[2*t4, g], B[2*t4+1, g] = w[0], w[1]      # b0: low half, k-low byte first
                            B[2*t4+8, g], B[2*t4+9, g] = w[2], w[3]    # b1: high half
                        assert not np.isnan(A).any() and not np.isnan(B).any()
                        C = A @ B
                        for lane in range(32):
                            g, t4 = lane >> 2, lane & 3
                            c = [C[g, 2*t4], C[g, 2*t4+1], C[g+8, 2*t4], C[g+8, 2*t4+1]]
                            for q in range(4):
                                if first and s == 0: part[warp, lane, i, j, q] = c[q]
                                else: part[warp, lane, i, j, q] += c[q]
    for t in range(0, nk, 2):
        sc = S[n0 >> 7, t >> 1]
        tile(t, True)
        if t + 1 < nk: tile(t + 1, False)
        acc += part*sc
    Y = np.full((M if xrows is None else start+rows, N), np.nan)
    for warp in range(8):
        wm, wn = warp >> 2, warp & 3
        for lane in range(32):
            g, t4 = lane >> 2, lane & 3
            for i in range(MT):
                for h in range(2):
                    r = wm*(BM//2) + i*16 + g + h*8
                    if r >= rows: continue
                    for j in range(4):
                        n = n0 + wn*32 + j*8 + 2*t4
                        if n < N: Y[start + r, n] = acc[warp, lane, i, j, 2*h]
                        if n + 1 < N: Y[start + r, n+1] = acc[warp, lane, i, j, 2*h+1]
    # reference
    Sw = np.repeat(np.repeat(S, 128, 0), 128, 1)[:N, :K]
    ref = np.full_like(Y, np.nan)
    for r in range(rows):
        xr = xrows[start + r] if xrows is not None else start + r
        ref[start + r, n0:min(n0+128, N)] = (W*Sw)[n0:min(n0+128, N)] @ X[xr]
    got = Y[start:start+rows, n0:min(n0+128, N)]; want = ref[start:start+rows, n0:min(n0+128, N)]
    assert not np.isnan(got).any(), "unwritten outputs"
    err = np.abs(got - want).max()
    print(f"MT={MT} M={M} N={N} K={K} rows={rows} n0={n0} xrows={'yes' if xrows is not None else 'no'}: max err {err}")
    assert err == 0
    # nothing written outside
    mask = np.ones_like(Y, bool); mask[start:start+rows, n0:min(n0+128, N)] = False
    assert np.isnan(Y[mask]).all(), "wrote outside the tile"

run(2, 50, 200, 208)
run(4, 130, 300, 160, n0=128)
run(4, 128, 128, 256)
xr = rng.integers(0, 40, size=200)
run(2, 40, 136, 112, xrows=xr, start=30, rows=37)
run(4, 40, 256, 16, xrows=xr, start=5, rows=128)
print("all ok")
