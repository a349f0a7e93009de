#!/usr/bin/env python3
"""The tiling of src/kernels/cuda_flash_attention.cu transliterated to numpy.

Checks the fused attention's algorithm where no GPU is at hand: 64-row tiles,
the causal and length masks, the forward's online softmax (running max and
sum, the output rescaled), the saved log-sum-exp, the backward's D =
rowsum(bf16(dout) * out) and its two passes (dk, dv per key tile; dq per query
tile), with the kernels' roundings to bf16 (q, k, v, dout; P before P @ V;
P and dS in the backward) and fp32 elsewhere. Compared with float64 attention
on the bf16-rounded operands; prints the share of CudaFlashAttentionTest's
tolerance (1.5e-2 of the output's largest magnitude, plus 1e-3) that each
output's largest error takes; exits 1 above it. Needs numpy; not part of the test
suite (the GPU test is the check of the kernels themselves).

    python3 tests/kernels/flash_attention_tiling.py
"""

import numpy as np

TILE = 64


def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def load(src, row0, T):  # src [T,hs]
    hs = src.shape[1]
    t = np.zeros((TILE, hs), np.float32)
    n = max(0, min(TILE, T - row0))
    t[:n] = src[row0 : row0 + n]
    return bf16(t)


def fwd(q, k, v):  # [T,hs] fp32 each
    T, hs = q.shape
    scale = np.float32(1 / np.sqrt(hs))
    nt = (T + TILE - 1) // TILE
    out = np.zeros((T, hs), np.float32)
    lse = np.zeros(T, np.float32)
    for qt in range(nt):
        q0 = qt * TILE
        sq = load(q, q0, T)
        so = np.zeros((TILE, hs), np.float32)
        m = np.full(TILE, -np.inf, np.float32)
        l = np.zeros(TILE, np.float32)
        for kt in range(qt + 1):
            k0 = kt * TILE
            sk = load(k, k0, T)
            sv = load(v, k0, T)
            s = sq.astype(np.float32) @ sk.T.astype(np.float32)
            qi = q0 + np.arange(TILE)[:, None]
            kj = k0 + np.arange(TILE)[None, :]
            s = np.where((kj <= qi) & (kj < T), s * scale, -np.inf).astype(np.float32)
            mx = s.max(1)
            mnew = np.maximum(m, mx)
            muse = np.where(mnew == -np.inf, 0, mnew)
            alpha = np.exp(m - muse)
            p = np.exp(s - muse[:, None]).astype(np.float32)
            l = l * alpha + p.sum(1)
            m = mnew
            so = so * alpha[:, None]
            so = so + bf16(p) @ sv
        n = min(TILE, T - q0)
        out[q0 : q0 + n] = (so / l[:, None])[:n]
        lse[q0 : q0 + n] = (m + np.log(l))[:n]
    return out, lse


def bwd(q, k, v, out, dout, lse):
    T, hs = q.shape
    scale = np.float32(1 / np.sqrt(hs))
    nt = (T + TILE - 1) // TILE
    D = (bf16(dout) * out).sum(1).astype(np.float32)  # dout as the matmuls see it
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)

    def stats(q0):
        a = np.zeros(TILE, np.float32)
        d = np.zeros(TILE, np.float32)
        n = max(0, min(TILE, T - q0))
        a[:n] = lse[q0 : q0 + n]
        d[:n] = D[q0 : q0 + n]
        return a, d

    for kt in range(nt):
        k0 = kt * TILE
        sk = load(k, k0, T)
        sv = load(v, k0, T)
        adk = np.zeros((TILE, hs), np.float32)
        adv = np.zeros_like(adk)
        for qt in range(kt, nt):
            q0 = qt * TILE
            sq = load(q, q0, T)
            sdo = load(dout, q0, T)
            sl, sd = stats(q0)
            st = sk @ sq.T
            dpt = sv @ sdo.T
            kj = k0 + np.arange(TILE)[:, None]
            qi = q0 + np.arange(TILE)[None, :]
            valid = (kj <= qi) & (qi < T) & (kj < T)
            p = np.where(valid, np.exp(st * scale - sl[None, :]), 0).astype(np.float32)
            ds = p * (dpt - sd[None, :])
            adv += bf16(p) @ sdo
            adk += bf16(ds) @ sq
        n = max(0, min(TILE, T - k0))
        dk[k0 : k0 + n] += scale * adk[:n]
        dv[k0 : k0 + n] += adv[:n]
    for qt in range(nt):
        q0 = qt * TILE
        sq = load(q, q0, T)
        sdo = load(dout, q0, T)
        sl, sd = stats(q0)
        adq = np.zeros((TILE, hs), np.float32)
        for kt in range(qt + 1):
            k0 = kt * TILE
            sk = load(k, k0, T)
            sv = load(v, k0, T)
            s = sq @ sk.T
            dp = sdo @ sv.T
            qi = q0 + np.arange(TILE)[:, None]
            kj = k0 + np.arange(TILE)[None, :]
            p = np.where((kj <= qi) & (kj < T), np.exp(s * scale - sl[:, None]), 0).astype(np.float32)
            adq += bf16(p * (dp - sd[:, None])) @ sk
        n = min(TILE, T - q0)
        dq[q0 : q0 + n] += scale * adq[:n]
    return dq, dk, dv


def ref(q, k, v, dout):  # float64 on rounded inputs
    q, k, v, dout = [bf16(x).astype(np.float64) for x in (q, k, v, dout)]
    T, hs = q.shape
    sc = 1 / np.sqrt(hs)
    s = q @ k.T * sc
    s = np.where(np.tril(np.ones((T, T))) > 0, s, -np.inf)
    m = s.max(1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(1, keepdims=True)
    p = e / l
    out = p @ v
    lse = (m + np.log(l))[:, 0]
    dp = dout @ v.T
    ds = p * (dp - (dp * p).sum(1, keepdims=True))
    return out, lse, sc * ds @ k, sc * ds.T @ q, p.T @ dout


rng = np.random.default_rng(1)
worst = 0.0
for T, hs in [(1, 64), (17, 16), (64, 32), (100, 64), (130, 128), (256, 64), (1024, 64)]:
    q, k, v = [rng.uniform(-2, 2, (T, hs)).astype(np.float32) for _ in range(3)]
    dout = rng.uniform(-1, 1, (T, hs)).astype(np.float32)
    out, lse = fwd(q, k, v)
    dq, dk, dv = bwd(q, k, v, out, dout, lse)
    r = ref(q, k, v, dout)

    # The GPU test's tolerance: |got - want| <= 1.5e-2 * max |want| + 1e-3.
    def used(a, b):
        return np.abs(a - b).max() / (1.5e-2 * np.abs(b).max() + 1e-3)

    u = [used(out, r[0]), used(dq, r[2]), used(dk, r[3]), used(dv, r[4])]
    worst = max(worst, *u)
    print(
        "T %4d hs %3d: share of the tolerance used: out %.2f dq %.2f dk %.2f dv %.2f; lse off by %.1e"
        % (T, hs, *u, np.abs(lse - r[1]).max())
    )
print("worst share %.2f: %s" % (worst, "OK" if worst <= 1 else "OVER"))
raise SystemExit(0 if worst <= 1 else 1)
