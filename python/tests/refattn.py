# SPDX-License-Identifier: MIT
"""Test helpers: a NumPy FP64 reference of (packed, windowed, soft-capped,
sink) attention and its gradients, storage rounding, and a driver that runs
one CP configuration on in-process ranks and gathers its results."""

import numpy as np

import infinicp

# Relative-RMS bounds of the C suites' CP=1 checks (tests/test-attn-v11.c):
# rounding to the storage type and fp32 arithmetic.
TOL = {"float32": 2e-5, "float16": 4 * 2.0 ** -11, "bfloat16": 4 * 2.0 ** -8}


def to_storage(x, dtype):
    """(array in the storage type, its values in float64)."""
    if dtype == "float32":
        s = np.ascontiguousarray(x, dtype=np.float32)
        return s, s.astype(np.float64)
    if dtype == "float16":
        s = np.ascontiguousarray(x, dtype=np.float16)
        return s, s.astype(np.float64)
    if dtype == "bfloat16":
        s = infinicp.float32_to_bf16_bits(np.asarray(x, dtype=np.float32))
        return s, infinicp.bf16_bits_to_float32(s).astype(np.float64)
    raise ValueError(dtype)


def values(a, dtype):
    """float64 values of an array in the storage type."""
    if dtype == "bfloat16":
        return infinicp.bf16_bits_to_float32(a).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


def rel_rms(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    num = np.sum((x - ref) ** 2)
    den = np.sum(ref ** 2)
    return float(np.sqrt(num / den) if den > 0 else np.sqrt(num))


def visible(S, causal, window, doc_ids=None):
    """[S, S] mask: query i sees key j."""
    i = np.arange(S)[:, None]
    j = np.arange(S)[None, :]
    m = j <= i if causal else np.ones((S, S), dtype=bool)
    if window:
        m &= (i - j < window) if causal else (np.abs(i - j) < window)
    if doc_ids is not None:
        m &= doc_ids[:, None] == doc_ids[None, :]
    return m


def reference(q, k, v, dout, causal=True, scale=0.0, window=0, softcap=0.0, sinks=None, doc_ids=None):
    """Plain softmax attention in float64 on [B, S, H, D] arrays (BSHD),
    with GQA, a causal mask, a window, document masks, a softcap and sink
    logits; returns a dict of out, lse [B, H, S], dq, dk, dv, dsinks and
    dsinks_scale (the size of the terms dsinks sums)."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    grp = H // Hkv
    scale = scale or 1.0 / np.sqrt(D)
    kk = np.repeat(k, grp, axis=2)
    vv = np.repeat(v, grp, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    vis = visible(S, causal, window, doc_ids)[None, None]
    sm = np.where(vis, s, -np.inf)
    m = sm.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(sm - m), 0.0)
    denom = e.sum(-1, keepdims=True)
    if sinks is not None:
        denom = denom + np.exp(sinks[None, :, None, None] - m)
    lse = (np.log(denom) + m)[..., 0]  # [B, H, S]
    p = e / denom
    out = np.einsum("bhij,bjhd->bihd", p, vv)
    # backward
    dp = np.einsum("bihd,bjhd->bhij", dout, vv)
    drow = np.einsum("bihd,bihd->bhi", dout, out)
    ds = p * (dp - drow[..., None])
    if softcap:
        ds = ds * (1 - t * t)
    ds = ds * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, kk)
    dk = np.einsum("bhij,bihd->bjhd", ds, q).reshape(B, S, Hkv, grp, D).sum(3)
    dv = np.einsum("bhij,bihd->bjhd", p, dout).reshape(B, S, Hkv, grp, v.shape[3]).sum(3)
    res = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    if sinks is not None:
        psink = np.exp(sinks[None, :, None] - lse)  # [B, H, S]
        terms = psink * drow
        res["dsinks"] = -terms.sum(axis=(0, 2))
        res["dsinks_scale"] = float(np.sqrt(np.sum(np.abs(terms).sum(axis=(0, 2)) ** 2)))
    return res


def doc_ids_of(cu):
    cu = np.asarray(cu)
    ids = np.zeros(cu[-1], dtype=np.int64)
    for d in range(len(cu) - 1):
        ids[cu[d]:cu[d + 1]] = d
    return ids


def run_cp(P, mode="p2p", layout="contiguous", causal=True, dtype="float32", B=2, S=32, H=4, Hkv=4, D=16, Dv=0,
           fmt="bshd", window=0, softcap=0.0, sinks=False, a2a=1, cu=None, balance="auto", seed=0, scale=0.0):
    """Run one CP configuration on P in-process ranks (forward and
    backward) and return (reference, gathered results) as float64 dicts in
    BSHD order."""
    Dv = Dv or D
    rng = np.random.default_rng(seed)
    if layout == "packed":
        B = 1
        if cu is None:
            cu = [0, 5, S // 2 - 1, S // 2, S]
        ids = doc_ids_of(cu)
        assert ids.size == S
    else:
        ids = None
    q_s, q = to_storage(rng.standard_normal((B, S, H, D)), dtype)
    k_s, k = to_storage(rng.standard_normal((B, S, Hkv, D)), dtype)
    v_s, v = to_storage(rng.standard_normal((B, S, Hkv, Dv)), dtype)
    do_s, do = to_storage(rng.standard_normal((B, S, H, Dv)), dtype)
    sink_logits = rng.standard_normal(H).astype(np.float32) if sinks else None
    ref = reference(q, k, v, do, causal, scale, window, softcap,
                    None if sink_logits is None else sink_logits.astype(np.float64), ids)

    def local(x, pos):
        part = x[:, pos]
        if fmt == "sbhd":
            part = part.transpose(1, 0, 2, 3)
        return np.ascontiguousarray(part)

    def rank_main(r, comm):
        with infinicp.Context("cpu", num_threads=1) as ctx, \
                infinicp.Group(ctx, comm, a2a_size=a2a) as group, \
                infinicp.AttnPlan(group, dtype, B, S, H, Hkv, D, Dv, causal, layout, mode, fmt, scale, window, softcap,
                                  sinks) as plan:
            pack = None
            if layout == "packed":
                pack = infinicp.Pack(P, cu, causal=causal, window=window, balance=balance)
                pos = pack.positions(r)
            else:
                pos = infinicp.layout_positions(layout, P, r, S)
            ql, kl, vl, dl = (local(x, pos) for x in (q_s, k_s, v_s, do_s))
            out, lse = plan.forward(ql, kl, vl, pack=pack, sinks=sink_logits)
            grads = plan.backward(ql, kl, vl, out, lse, dl, pack=pack, sinks=sink_logits)
            if pack is not None:
                pack.close()
            return pos, out, lse, grads

    results = infinicp.run_ranks(P, rank_main)
    got = {n: np.full_like(ref[n], np.nan) for n in ("out", "lse", "dq", "dk", "dv")}
    if sinks:
        got["dsinks"] = np.zeros(H)
    for pos, out, lse, grads in results:
        def glob(a):
            a = values(a, dtype)
            return a.transpose(1, 0, 2, 3) if fmt == "sbhd" else a
        got["out"][:, pos] = glob(out)
        got["lse"][:, :, pos] = lse
        got["dq"][:, pos] = glob(grads[0])
        got["dk"][:, pos] = glob(grads[1])
        got["dv"][:, pos] = glob(grads[2])
        if sinks:
            assert len(grads) == 4 and grads[3].dtype == np.float32 and grads[3].shape == (H,)
            got["dsinks"] += grads[3]
        else:
            assert len(grads) == 3
    return ref, got


def check_close(ref, got, dtype, what=""):
    """Assert the CP results match the reference within the dtype's bound."""
    tol = TOL[dtype]
    for n in ("out", "lse", "dq", "dk", "dv"):
        assert not np.isnan(got[n]).any(), "%s: %s has tokens no rank wrote" % (what, n)
        e = rel_rms(got[n], ref[n])
        assert e <= tol, "%s: %s relative RMS error %.3g above %.3g" % (what, n, e, tol)
    if "dsinks" in ref:
        e = float(np.sqrt(np.sum((got["dsinks"] - ref["dsinks"]) ** 2))) / ref["dsinks_scale"]
        assert e <= tol, "%s: dsinks error %.3g above %.3g" % (what, e, tol)
