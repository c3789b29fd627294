# SPDX-License-Identifier: MIT
"""CP attention on in-process ranks driven by Python threads, forward and
backward, against the NumPy FP64 reference in refattn.py."""

import re
import threading
import time

import numpy as np
import pytest

import infinicp
from refattn import TOL, check_close, rel_rms, run_cp, to_storage, values

MODES = ["all_gather", "p2p", "a2a", "a2a_p2p"]
LAYOUTS = ["contiguous", "zigzag", "packed"]
DTYPES = ["float32", "float16", "bfloat16"]


def a2a_of(mode):
    return 2 if mode == "a2a_p2p" else 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "nomask"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("P", [2, 4])
def test_modes_layouts(P, mode, layout, causal, heads, dtype):
    """Every mode x layout x mask on 2 and 4 ranks, MHA and GQA, f32 / f16 / bf16 bits."""
    Hkv = 4 if heads == "mha" else 2
    ref, got = run_cp(P, mode, layout, causal, dtype, Hkv=Hkv, a2a=a2a_of(mode), seed=P * 7 + len(mode))
    check_close(ref, got, dtype, "%s %s P=%d" % (mode, layout, P))


FEATURES = {
    "window": dict(window=5),
    "softcap": dict(softcap=1.5),
    "sinks": dict(sinks=True),
    "all": dict(window=7, softcap=3.0, sinks=True),
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "nomask"])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_window_softcap_sinks(mode, layout, feature, causal, dtype):
    """Windows, softcaps and sinks (with dsinks), on dense and packed rows."""
    ref, got = run_cp(4, mode, layout, causal, dtype, Hkv=2, a2a=2, seed=11, **FEATURES[feature])
    check_close(ref, got, dtype, "%s %s %s" % (mode, layout, feature))


@pytest.mark.parametrize("mode", MODES)
def test_bf16_sinks_window_packed(mode):
    ref, got = run_cp(4, mode, "packed", True, "bfloat16", Hkv=2, a2a=2, window=9, softcap=2.0, sinks=True, seed=3)
    check_close(ref, got, "bfloat16", mode)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("P", [2, 4])
def test_sbhd(P, mode, layout):
    ref, got = run_cp(P, mode, layout, True, "float32", B=2, Hkv=2, fmt="sbhd", a2a=a2a_of(mode), seed=5)
    check_close(ref, got, "float32", "sbhd")


@pytest.mark.parametrize("mode", MODES)
def test_head_dim_v_and_scale(mode):
    ref, got = run_cp(4, mode, "zigzag", True, "float32", D=16, Dv=8, Hkv=1 if mode == "all_gather" else 2,
                      a2a=2, scale=0.3, seed=9)
    check_close(ref, got, "float32", "Dv=8")


@pytest.mark.parametrize("balance", ["auto", "greedy", "contiguous", "doc_zigzag"])
@pytest.mark.parametrize("mode", MODES)
def test_pack_balances(mode, balance):
    cu = [0, 8, 24, 32, 64]  # every length a multiple of 2P = 8 for doc_zigzag
    ref, got = run_cp(4, mode, "packed", True, "float32", S=64, Hkv=2, a2a=2, cu=cu, balance=balance, seed=13)
    check_close(ref, got, "float32", balance)


def test_one_rank():
    ref, got = run_cp(1, "p2p", "contiguous", True, "float32", seed=2)
    check_close(ref, got, "float32", "P=1")


def test_eight_ranks_hybrid():
    ref, got = run_cp(8, "a2a_p2p", "zigzag", True, "float32", S=64, H=8, Hkv=4, a2a=4, seed=4)
    check_close(ref, got, "float32", "P=8 a2a 4")


@pytest.mark.parametrize("mode", ["p2p", "a2a"])
def test_ml_dtypes_bfloat16(mode):
    """ml_dtypes.bfloat16 arrays work as they are, and outputs keep that type."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    S, H, D = 32, 4, 16
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, S, H, D)).astype(ml_dtypes.bfloat16) for _ in range(3))
    ref = None

    def rank_main(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g, \
                infinicp.AttnPlan(g, "bfloat16", 1, S, H, H, D, mode=mode) as plan:
            pos = infinicp.layout_positions("contiguous", 2, r, S)
            out, lse = plan.forward(*(np.ascontiguousarray(x[:, pos]) for x in (q, k, v)))
            assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32
            return pos, out.astype(np.float64)

    from refattn import reference
    f = lambda x: x.astype(np.float64)  # noqa: E731
    ref = reference(f(q), f(k), f(v), np.zeros((1, S, H, D)))
    got = np.zeros_like(ref["out"])
    for pos, out in infinicp.run_ranks(2, rank_main):
        got[:, pos] = out
    assert rel_rms(got, ref["out"]) <= TOL["bfloat16"]


def _plan_world(P, fn, **plan_kw):
    """Run fn(rank, plan) on P ranks with one float32 plan each."""
    kw = dict(dtype="float32", batch=1, seq_len=32, num_heads=4, num_kv_heads=4, head_dim=8)
    kw.update(plan_kw)

    def rank_main(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm, timeout_ms=20000) as g, \
                infinicp.AttnPlan(g, **kw) as plan:
            return fn(r, plan)

    return infinicp.run_ranks(P, rank_main)


def test_bad_array_on_one_rank_fails_fast():
    """A rank with a wrong-shaped q raises ArgumentError naming q; the other
    rank fails at once with MISMATCH (the bad rank still took part in the
    call); the next call pairs up as usual."""
    outcome = {}

    def fn(r, plan):
        q = np.zeros(plan.q_shape, np.float32)
        bad = np.zeros((1, 3, 4, 8), np.float32) if r == 0 else q
        t0 = time.monotonic()
        try:
            plan.forward(bad, q, q)
        except infinicp.Error as e:
            outcome[r] = (e, time.monotonic() - t0)
        out, lse = plan.forward(q, q, q)  # the next call works on both
        return out.shape

    shapes = _plan_world(2, fn)
    assert shapes == [(1, 16, 4, 8)] * 2
    e0, _ = outcome[0]
    e1, t1 = outcome[1]
    assert isinstance(e0, infinicp.ArgumentError) and e0.status == infinicp.Status.INVALID_ARGUMENT
    assert "q has shape (1, 3, 4, 8)" in str(e0) and "(1, 16, 4, 8)" in str(e0)
    assert e1.status == infinicp.Status.MISMATCH and e1.message
    assert t1 < 10


@pytest.mark.parametrize("case", ["dtype", "noncontig", "not_array", "lse_dtype", "kv_shape"])
def test_bad_arrays(case):
    def fn(r, plan):
        q = np.zeros(plan.q_shape, np.float32)
        k = np.zeros(plan.k_shape, np.float32)
        if case == "dtype":
            args, name = (q.astype(np.float64), k, k), "q has dtype float64"
        elif case == "noncontig":
            b, t, h, d = plan.k_shape
            args, name = (q, np.zeros((b, t, d, h), np.float32).transpose(0, 1, 3, 2), k), "k is not C-contiguous"
        elif case == "not_array":
            args, name = (q, k, [1, 2, 3]), "expected an array"
        elif case == "kv_shape":
            args, name = (q, k, np.zeros((1, 32, 4, 4), np.float32)), "v has shape (1, 32, 4, 4)"
        else:
            out, lse = plan.forward(q, k, k)
            with pytest.raises(infinicp.ArgumentError, match="lse has dtype float64"):
                plan.backward(q, k, k, out, lse.astype(np.float64), out)
            return True
        with pytest.raises(infinicp.Error, match=re.escape(name)) as ei:
            plan.forward(*args)
        assert ei.value.status == infinicp.Status.INVALID_ARGUMENT
        assert isinstance(ei.value, ValueError)
        return True

    assert _plan_world(1, fn) == [True]


def test_packed_needs_pack_and_sinks_need_sinks():
    def fn(r, plan):
        q = np.zeros(plan.q_shape, np.float32)
        with pytest.raises(infinicp.Error, match="pack") as ei:
            plan.forward(q, q, q)
        assert ei.value.status == infinicp.Status.INVALID_ARGUMENT
        with infinicp.Pack(2, [0, 10, 32]) as pk:
            with pytest.raises(infinicp.Error, match="sinks"):
                plan.forward(q, q, q, pack=pk)
            with pytest.raises(infinicp.Error, match="sinks has shape"):
                plan.forward(q, q, q, pack=pk, sinks=np.zeros(3, np.float32))
            out, lse = plan.forward(q, q, q, pack=pk, sinks=np.zeros(4, np.float32))
            res = plan.backward(q, q, q, out, lse, out, pack=pk, sinks=np.zeros(4, np.float32))
            assert len(res) == 4
        with infinicp.Pack(2, [0, 16]) as other:  # another length than the plan's
            with pytest.raises(infinicp.Error, match="16 tokens"):
                plan.forward(q, q, q, pack=other, sinks=np.zeros(4, np.float32))
        return True

    assert _plan_world(2, fn, layout="packed", sinks=True) == [True, True]


def test_pack_changes_between_calls():
    """One packed plan, a new pack for every batch."""
    S = 32
    rng = np.random.default_rng(0)
    for cu in ([0, 32], [0, 1, 2, 3, 32], [0, 16, 17, 32], [0, 31, 32]):
        q, k, v, do = (rng.standard_normal((1, S, 4, 8)) for _ in range(4))
        from refattn import doc_ids_of, reference
        q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, do))
        ref = reference(*(x.astype(np.float64) for x in (q32, k32, v32, do32)), doc_ids=doc_ids_of(cu))

        def fn(r, plan):
            with infinicp.Pack(2, cu) as pk:
                pos = pk.positions(r)
                loc = [np.ascontiguousarray(x[:, pos]) for x in (q32, k32, v32, do32)]
                out, lse = plan.forward(*loc[:3], pack=pk)
                return pos, out

        got = np.zeros_like(ref["out"])
        for pos, out in _plan_world(2, fn, layout="packed"):
            got[:, pos] = out
        assert rel_rms(got, ref["out"]) <= TOL["float32"], cu


class DLPackOnly:
    """An array that only speaks DLPack (as JAX or other libraries do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_inputs():
    if not hasattr(np.ndarray, "__dlpack__"):
        pytest.skip("this NumPy has no __dlpack__")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32, 4, 8)).astype(np.float32)

    def fn(r, plan):
        out_np, lse_np = plan.forward(q, q, q)
        out, lse = plan.forward(DLPackOnly(q), DLPackOnly(q), DLPackOnly(q))
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        np.testing.assert_array_equal(out, out_np)
        np.testing.assert_array_equal(lse, lse_np)
        return True

    assert _plan_world(1, fn) == [True]


def test_repeat_calls_are_reproducible():
    rng = np.random.default_rng(0)
    q_s, _ = to_storage(rng.standard_normal((1, 32, 4, 8)), "float16")

    def fn(r, plan):
        pos = infinicp.layout_positions("zigzag", 2, r, 32)
        ql = np.ascontiguousarray(q_s[:, pos])
        first = plan.forward(ql, ql, ql)
        g1 = plan.backward(ql, ql, ql, first[0], first[1], first[0])
        for _ in range(3):
            again = plan.forward(ql, ql, ql)
            g2 = plan.backward(ql, ql, ql, again[0], again[1], again[0])
            for a, b in zip(first + g1, again + g2):
                np.testing.assert_array_equal(a, b)
        return values(first[0], "float16").shape

    assert _plan_world(2, fn, dtype="float16", layout="zigzag", mode="p2p") == [(1, 16, 4, 8)] * 2


def test_ranks_run_concurrently():
    """Calls release the GIL: a collective completes only if every rank's
    thread is inside it at once, which run_ranks' threads achieve."""
    seen = []
    lock = threading.Lock()

    def fn(r, plan):
        q = np.ones(plan.q_shape, np.float32)
        for _ in range(5):
            plan.forward(q, q, q)
        with lock:
            seen.append(r)
        return r

    assert _plan_world(4, fn, mode="p2p") == [0, 1, 2, 3]
    assert sorted(seen) == [0, 1, 2, 3]
