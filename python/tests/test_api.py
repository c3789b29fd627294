# SPDX-License-Identifier: MIT
"""The package's API besides attention numerics: version, errors,
contexts, communicators, topology, layouts, training helpers, kernels,
handle lifetimes, the C structures' layout."""

import gc
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import infinicp
from infinicp import Status
from refattn import TOL, reference, rel_rms

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(infinicp.__file__)))  # the package under test


def ranks(n, fn):
    return infinicp.run_ranks(n, fn)


# ---------------------------------------------------------------------------
# version, errors
# ---------------------------------------------------------------------------


def test_version():
    v = infinicp.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    info = infinicp.version_info()
    assert v == "%d.%d.%d" % info
    assert info >= (1, 1, 0) and info[0] == 1
    assert infinicp.__version__ == "1.2.0"
    assert infinicp.library_path()


def test_status_strings():
    for s in Status:
        text = infinicp.status_string(s)
        assert text and isinstance(text, str)
    assert infinicp.status_string(999) == "unknown status"


def test_error_type():
    e = infinicp.Error(Status.TIMEOUT, "peer did not come")
    assert isinstance(e, Exception) and e.status == 6 and e.status == Status.TIMEOUT
    assert str(e) == "peer did not come" and e.status_name == "TIMEOUT"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is infinicp.Error and back.status == 6 and back.message == e.message
    a = pickle.loads(pickle.dumps(infinicp.ArgumentError(1, "x")))
    assert isinstance(a, infinicp.ArgumentError) and isinstance(a, ValueError)
    assert infinicp.Error(42).status == 42  # unknown codes stay ints


def plan_error(**kw):
    """The error of making a plan on one rank."""
    args = dict(dtype="float32", batch=1, seq_len=32, num_heads=4, num_kv_heads=4, head_dim=8)
    args.update(kw)
    errors = []

    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g:
            try:
                infinicp.AttnPlan(g, **args)
            except infinicp.Error as e:
                errors.append(e)

    ranks(1, fn)
    assert len(errors) == 1, "no error for %s" % kw
    return errors[0]


@pytest.mark.parametrize("kw,status,words", [
    (dict(num_heads=0), Status.INVALID_ARGUMENT, "num_heads"),
    (dict(head_dim=-1), Status.INVALID_ARGUMENT, "head_dim"),
    (dict(num_kv_heads=3), Status.INVALID_ARGUMENT, "num_kv_heads"),
    (dict(seq_len=0), Status.INVALID_ARGUMENT, "seq_len"),
    (dict(window=-2), Status.INVALID_ARGUMENT, "window"),
    (dict(softcap=-1.0), Status.INVALID_ARGUMENT, "softcap"),
    (dict(layout="packed", batch=2), Status.INVALID_ARGUMENT, "batch"),
    (dict(dtype="float64"), Status.UNSUPPORTED, "F64|dtype"),
    (dict(dtype="int8"), Status.INVALID_ARGUMENT, "dtype"),
    (dict(mode="ring"), Status.INVALID_ARGUMENT, "mode"),
    (dict(layout="spiral"), Status.INVALID_ARGUMENT, "layout"),
    (dict(format="bhsd"), Status.INVALID_ARGUMENT, "format"),
    (dict(batch="two"), Status.INVALID_ARGUMENT, "batch"),
    (dict(softmax_scale=float("nan")), Status.INVALID_ARGUMENT, "scale"),
])
def test_plan_errors(kw, status, words):
    e = plan_error(**kw)
    assert e.status == status, repr(e)
    assert re.search(words, e.message), e.message
    assert str(e) == e.message


def test_plan_errors_reach_every_rank_at_once():
    """Ranks disagreeing on a descriptor all fail with MISMATCH, and a rank
    whose own arguments are bad gets its error while its peers get
    MISMATCH, without waiting for a timeout."""
    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm, timeout_ms=20000) as g:
            try:
                infinicp.AttnPlan(g, "float32", 1, 32 if r == 0 else 64, 4, 4, 8)
            except infinicp.Error as e:
                first = e.status
            try:  # Python-side check on rank 1 (a bad name): it still takes part
                infinicp.AttnPlan(g, "float32", 1, 32, 4, 4, 8, mode="p2p" if r == 0 else "ring")
            except infinicp.Error as e:
                second = e.status, e.message
            return first, second

    t0 = time.monotonic()
    (f0, s0), (f1, s1) = ranks(2, fn)
    assert time.monotonic() - t0 < 10
    assert f0 == f1 == Status.MISMATCH
    assert s0[0] == Status.MISMATCH
    assert s1[0] == Status.INVALID_ARGUMENT and "mode" in s1[1]


def test_context_errors():
    with pytest.raises(infinicp.Error) as ei:
        infinicp.Context("tpu")
    assert ei.value.status == Status.INVALID_ARGUMENT and "device" in str(ei.value)
    with pytest.raises(infinicp.Error, match="num_threads") as ei:
        infinicp.Context("cpu", num_threads=-1)
    assert ei.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(infinicp.Error, match="device_index|index") as ei:
        infinicp.Context("cpu", device_index=1)
    with pytest.raises(infinicp.Error, match="stream"):
        infinicp.Context("cpu", stream=0x1234)
    with pytest.raises(infinicp.Error, match="stream"):
        infinicp.Context("cpu", stream=object())
    with infinicp.Context("cpu", num_threads=1) as ctx:
        ctx.synchronize()
        ctx.set_stream(None)
        with pytest.raises(infinicp.Error, match="stream") as ei:
            ctx.set_stream(0x10)
        assert ei.value.status == Status.INVALID_ARGUMENT
    assert ctx.closed
    with pytest.raises(infinicp.Error, match="closed"):
        ctx.synchronize()


def test_cuda_context_without_gpu_raises():
    """Here the CUDA module or GPU is missing: the error says so (on a
    machine with both, the context simply works)."""
    try:
        ctx = infinicp.Context("cuda")
    except infinicp.Error as e:
        assert e.status in (Status.NOT_FOUND, Status.BACKEND, Status.INVALID_ARGUMENT, Status.UNSUPPORTED)
        assert e.message
    else:
        assert ctx.device == "cuda"
        ctx.close()


def test_deterministic_context():
    with infinicp.Context("cpu", num_threads=2, deterministic=True) as ctx:
        assert ctx.deterministic and ctx.num_threads == 2
    with pytest.raises(infinicp.Error, match="deterministic"):
        infinicp.Context("cpu", deterministic=2)


def test_local_world_errors():
    for n in (0, -1, 5000):
        with pytest.raises(infinicp.Error, match="nranks") as ei:
            infinicp.local_world(n)
        assert ei.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        infinicp.Comm()


def test_group_errors():
    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx:
            with pytest.raises(infinicp.Error, match="a2a_size") as ei:
                infinicp.Group(ctx, comm, a2a_size=3)
            assert ei.value.status in (Status.INVALID_ARGUMENT, Status.MISMATCH)
            with pytest.raises(infinicp.Error, match="timeout_ms"):
                infinicp.Group(ctx, comm, timeout_ms=0)
            with pytest.raises(infinicp.Error, match="ctx must be a Context"):
                infinicp.Group("ctx", comm)  # takes part all the same: peers fail too
            return True

    assert ranks(2, fn) == [True, True]


def test_group_mismatch_one_rank():
    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx:
            try:
                infinicp.Group(ctx, comm, a2a_size=1 if r == 0 else 2, timeout_ms=20000)
            except infinicp.Error as e:
                return e.status

    assert ranks(2, fn) == [Status.MISMATCH, Status.MISMATCH]


def test_error_message_is_the_failing_threads_own():
    """cp_last_error is per thread: concurrent failures keep their messages."""
    msgs = {}

    def fail(i):
        for _ in range(50):
            try:
                infinicp.layout_positions("contiguous", 4, 0, 10 + 4 * i + 1)
            except infinicp.Error as e:
                msgs.setdefault(i, set()).add(e.message)

    ts = [threading.Thread(target=fail, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(4):
        assert len(msgs[i]) == 1
        assert str(10 + 4 * i + 1) in next(iter(msgs[i]))


# ---------------------------------------------------------------------------
# topology, layouts
# ---------------------------------------------------------------------------


def test_topology_coords_and_groups():
    t = infinicp.Topology(16, tp=2, cp=4, pp=1, cp_a2a=2)
    assert (t.world_size, t.tp, t.cp, t.dp, t.pp, t.cp_a2a, t.order) == (16, 2, 4, 2, 1, 2, "tp-cp-dp-pp")
    for r in range(16):
        c = t.coords(r)
        assert c == (r % 2, r // 2 % 4, r // 8, 0, (r // 2 % 4) % 2, (r // 2 % 4) // 2)
        assert c.cp == c.cp_a2a + c.cp_p2p * 2
        assert c._asdict()["tp"] == r % 2
        assert t.rank(c) == r
        assert t.rank(tp=c.tp, cp=c.cp, dp=c.dp) == r
        cp_group = t.group(r, "cp")
        assert cp_group == sorted(x for x in range(16) if t.coords(x).tp == c.tp and t.coords(x).dp == c.dp)
        assert cp_group.index(r) == c.cp
        assert t.group(r, ("dp", "cp")) == t.group(r, infinicp.AXIS_DP | infinicp.AXIS_CP)
        assert len(t.group(r, "dp,cp")) == 8
        assert t.group(r, 0) == [r]
        assert t.group(r, "cp_a2a") == [x for x in cp_group if t.coords(x).cp_p2p == c.cp_p2p]
        color, key = t.color(r, "cp")
        assert key == c.cp and 0 <= color < 4
        assert t.is_writer(r, "sharded")
        assert t.is_writer(r, "replicated") == (c.dp == 0 and c.cp == 0)
    t.close()


def test_topology_order_and_errors():
    t = infinicp.Topology(8, tp=2, cp=2, dp=2, order="cp-tp-dp-pp")
    assert t.coords(1) == (0, 1, 0, 0, 0, 1)
    assert t.coords(2).tp == 1
    for kw, word in ((dict(world_size=6, cp=4), "cp|world_size"), (dict(world_size=8, tp=0), "tp"),
                     (dict(world_size=8, cp=4, cp_a2a=3), "cp_a2a"), (dict(world_size=4, order="tp-cp-dp"), "order"),
                     (dict(world_size=4, order="tp-tp-dp-pp"), "order")):
        with pytest.raises(infinicp.Error, match=word) as ei:
            infinicp.Topology(**kw)
        assert ei.value.status == Status.INVALID_ARGUMENT
    for bad in (-1, 8):
        with pytest.raises(infinicp.Error, match="rank"):
            t.coords(bad)
    with pytest.raises(infinicp.Error, match="axis"):
        t.group(0, "ep")
    with pytest.raises(infinicp.Error, match="role"):
        t.is_writer(0, "mirrored")


def test_seq_local_len_and_stage_shape():
    t = infinicp.Topology(8, tp=2, cp=4)
    d = infinicp.AttnDesc("bfloat16", batch=2, seq_len=4096, num_heads=8, head_dim=64, layout="zigzag")
    assert t.seq_local_len(d) == 1024
    assert t.stage_shape(d, 512) == ((2, 1024, 512), 2 * 1024 * 512 * 2)
    assert t.stage_shape(d, 512, sequence_parallel=True)[0] == (2, 512, 512)
    d.format = "sbhd"
    assert t.stage_shape(d, 512)[0] == (1024, 2, 512)
    with pytest.raises(infinicp.Error, match="seq_len"):
        t.seq_local_len(dict(dtype="float32", batch=1, seq_len=4100, num_heads=8, head_dim=64, layout="zigzag"))


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_layout_positions(P):
    S = 2 * P * 5
    for r in range(P):
        c = infinicp.layout_positions("contiguous", P, r, S)
        assert c.dtype == np.int64 and list(c) == list(range(r * S // P, (r + 1) * S // P))
        z = infinicp.layout_positions("zigzag", P, r, S)
        n = S // (2 * P)
        assert list(z) == list(range(r * n, (r + 1) * n)) + list(range((2 * P - 1 - r) * n, (2 * P - r) * n))
    allz = np.concatenate([infinicp.layout_positions("zigzag", P, r, S) for r in range(P)])
    assert sorted(allz) == list(range(S))


def test_layout_positions_errors():
    with pytest.raises(infinicp.Error, match="seq_len") as ei:
        infinicp.layout_positions("zigzag", 4, 0, 12)
    assert ei.value.status == Status.INVALID_ARGUMENT
    for args in (("contiguous", 0, 0, 8), ("contiguous", 2, 2, 8), ("packed", 2, 0, 8), ("contiguous", 2, 0, 0)):
        with pytest.raises(infinicp.Error):
            infinicp.layout_positions(*args)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_layout_shard_and_gather(layout):
    P, B, S = 4, 3, 16
    x = np.arange(B * S * 5, dtype=np.float32).reshape(B, S, 5)

    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g:
            part = infinicp.layout_shard(x, layout, P, r, dim=1)
            pos = infinicp.layout_positions(layout, P, r, S)
            np.testing.assert_array_equal(part, x[:, pos])
            whole = g.gather(part, layout, dim=1)
            np.testing.assert_array_equal(whole, x)
            # a token axis first (SBHD-like), int64 per-token data
            ids = np.arange(S * 2, dtype=np.int64).reshape(S, 2)
            np.testing.assert_array_equal(g.gather(infinicp.layout_shard(ids, layout, P, r, dim=0), layout, dim=0),
                                          ids)
            return True

    assert ranks(P, fn) == [True] * P
    with pytest.raises(infinicp.Error, match="contiguous"):
        infinicp.layout_shard(x[:, ::2], layout, 2, 0)


# ---------------------------------------------------------------------------
# communicators and training helpers
# ---------------------------------------------------------------------------


def test_comm_rank_size_split():
    comms = infinicp.local_world(4)
    assert [(c.rank, c.size) for c in comms] == [(i, 4) for i in range(4)]

    def fn(r, comm):
        sub = comm.split(r % 2, key=-r)  # two groups, ordered by descending old rank
        none = comm.split(-1 if r == 0 else 0)
        res = (sub.rank, sub.size, None if none is None else (none.rank, none.size))
        sub.close()
        if none is not None:
            none.close()
        return res

    res = infinicp.run_ranks(comms, fn)
    assert res == [(1, 2, None), (1, 2, (0, 3)), (0, 2, (1, 3)), (0, 2, (2, 3))]
    for c in comms:
        c.close()
    assert all(c.closed for c in comms)


def test_loss_reduce_and_grad_all_reduce():
    P = 3

    def fn(r, comm):
        mean, total = comm.loss_reduce(float(r + 1) * 10, r + 1)
        g32 = np.full(1000, r + 1, dtype=np.float32)
        comm.grad_all_reduce(g32)
        g16 = np.full(7, r + 1, dtype=np.float16)
        comm.grad_all_reduce(g16, op="average", bucket_bytes=4)
        gbf = infinicp.float32_to_bf16_bits(np.full(5, r + 1.5, np.float32))
        comm.grad_all_reduce(gbf, dtype="bfloat16")
        with pytest.raises(infinicp.Error, match="uint16"):
            comm.grad_all_reduce(np.zeros(3, np.uint16))
        with pytest.raises(infinicp.Error, match="op"):
            comm.grad_all_reduce(g32, op="max")
        return mean, total, g32[0], g16[0], infinicp.bf16_bits_to_float32(gbf)[0]

    for mean, total, a, b, c in ranks(P, fn):
        assert mean == pytest.approx(60 / 6) and total == 6
        assert a == 6 and b == 2 and c == 1.5 + 2.5 + 3.5


def test_grad_all_reduce_mismatch():
    def fn(r, comm):
        try:
            comm.grad_all_reduce(np.zeros(4 + r, np.float32))
        except infinicp.Error as e:
            return e.status

    assert ranks(2, fn) == [Status.MISMATCH, Status.MISMATCH]


def test_run_ranks_reraises_root_cause_without_waiting():
    """Rank 1 fails in Python before a collective rank 0 waits in: run_ranks
    releases rank 1's objects, so rank 0 fails at once, and the error
    raised is rank 1's own."""
    def fn(r, comm):
        ctx = infinicp.Context(num_threads=1)
        g = infinicp.Group(ctx, comm, timeout_ms=60000)
        plan = infinicp.AttnPlan(g, "float32", 1, 16, 2, 2, 4)
        if r == 1:
            raise KeyError("rank 1 broke")
        q = np.zeros(plan.q_shape, np.float32)
        plan.forward(q, q, q)

    t0 = time.monotonic()
    with pytest.raises(KeyError, match="rank 1 broke"):
        infinicp.run_ranks(2, fn)
    assert time.monotonic() - t0 < 30
    gc.collect()
    assert infinicp.live_handles() == {}


def test_run_ranks_results_and_args():
    assert infinicp.run_ranks(3, lambda r, c, k=0: (r, c.size, k), k=5) == [(0, 3, 5), (1, 3, 5), (2, 3, 5)]


def test_nccl_calls_are_optional():
    """The NCCL unique-id calls are bound lazily: without them (or without
    the CUDA module / a GPU) the calls raise infinicp.Error."""
    try:
        uid = infinicp.nccl_unique_id()
    except infinicp.Error as e:
        assert e.status != Status.SUCCESS and e.message
        if not infinicp.have_nccl_id():
            assert e.status == Status.UNSUPPORTED
    else:
        assert isinstance(uid, bytes) and len(uid) == 128
    with infinicp.Context(num_threads=1) as ctx:
        with pytest.raises(infinicp.Error):
            infinicp.Comm.from_nccl_id(ctx, b"\0" * 128, 1, 0)
        if infinicp.have_nccl_id():
            with pytest.raises(infinicp.Error, match="id_bytes|128|bytes"):
                infinicp.Comm.from_nccl_id(ctx, b"\0" * 12, 1, 0)
    with pytest.raises(infinicp.Error):
        infinicp.Comm.from_nccl(0)


def test_mpi_without_module_raises():
    with pytest.raises(infinicp.Error):
        infinicp.Comm.from_mpi(0)


# ---------------------------------------------------------------------------
# single-device kernels
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_kernels(causal):
    rng = np.random.default_rng(3)
    B, S, H, Hkv, D = 2, 24, 4, 2, 8
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = rng.standard_normal((B, S, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, S, Hkv, D)).astype(np.float32)
    do = rng.standard_normal((B, S, H, D)).astype(np.float32)
    f = lambda x: x.astype(np.float64)  # noqa: E731
    ref = reference(f(q), f(k), f(v), f(do), causal=causal, window=6, softcap=2.0)
    with infinicp.Context(num_threads=1) as ctx:
        out, lse = infinicp.kernel_attention_forward(ctx, q, k, v, causal=causal, window=6, softcap=2.0)
        assert rel_rms(out, ref["out"]) < TOL["float32"] and rel_rms(lse, ref["lse"]) < TOL["float32"]
        dq, dk, dv = infinicp.kernel_attention_backward(ctx, q, k, v, out, lse, do, causal=causal, window=6,
                                                        softcap=2.0)
        for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
            assert rel_rms(got, ref[name]) < TOL["float32"], name
        # two halves of the keys, merged, are the whole
        h = S // 2
        o1, l1 = infinicp.kernel_attention_forward(ctx, q, k[:, :h].copy(), v[:, :h].copy(), causal=causal,
                                                   k_offset=0, window=6, softcap=2.0)
        o2, l2 = infinicp.kernel_attention_forward(ctx, q, k[:, h:].copy(), v[:, h:].copy(), causal=causal,
                                                   k_offset=h, window=6, softcap=2.0)
        infinicp.kernel_merge(ctx, o1, l1, o2, l2)
        assert rel_rms(o1, ref["out"]) < TOL["float32"] and rel_rms(l1, ref["lse"]) < TOL["float32"]
        # rectangles: one per batch-independent block, the whole square
        o3, l3 = infinicp.kernel_attention_forward(ctx, q, k, v, causal=causal, window=6, softcap=2.0,
                                                   rects=[(0, S, 0, S, 0, 0)])
        np.testing.assert_allclose(o3, out, rtol=1e-6, atol=1e-6)
        with pytest.raises(infinicp.Error, match="head_dim must agree"):
            infinicp.kernel_attention_forward(ctx, q, k[..., :4].copy(), v)


# ---------------------------------------------------------------------------
# handles
# ---------------------------------------------------------------------------


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_leak_over_a_loop():
    """Create and destroy 100 plans (with workspaces), groups, packs,
    topologies and metadata: no C object stays, and memory does not grow."""
    def fn(r, comm, n):
        q = np.ones((1, 64, 4, 16), np.float32)
        with infinicp.Context(num_threads=1) as ctx:
            for i in range(n):
                g = infinicp.Group(ctx, comm)
                plan = infinicp.AttnPlan(g, "float32", 1, 128, 4, 4, 16, mode="p2p", layout="zigzag")
                out, lse = plan.forward(q, q, q)
                plan.backward(q, q, q, out, lse, out)
                if i % 2:
                    plan.close()
                    g.close()
                else:
                    del plan, g  # the garbage collector's path
                pk = infinicp.Pack(2, [0, 100, 128])
                del pk
                t = infinicp.Topology(4, cp=2)
                m = infinicp.CkptMeta(t, dict(batch=1, seq_len=128, num_heads=4, head_dim=16))
                del m, t

    infinicp.run_ranks(2, fn, 10)  # warm up allocator and caches
    gc.collect()
    base = _rss_kib()
    infinicp.run_ranks(2, fn, 100)
    gc.collect()
    assert infinicp.live_handles() == {}
    grown = _rss_kib() - base
    assert grown < 8 * 1024, "RSS grew by %d KiB over 100 plans" % grown


def test_close_order_cascades():
    """Closing a context or a communicator first closes the groups and plans
    made from it; a plan, group and context left to the garbage collector
    in a reference cycle are released in a valid order too."""
    def fn(r, comm):
        ctx = infinicp.Context(num_threads=1)
        g = infinicp.Group(ctx, comm)
        plan = infinicp.AttnPlan(g, "float32", 1, 16, 2, 2, 4)
        assert infinicp.live_handles().get("plan", 0) >= 1
        ctx.close()
        assert plan.closed and g.closed and ctx.closed
        with pytest.raises(infinicp.Error, match="closed"):
            plan.forward(None, None, None)
        ctx2 = infinicp.Context(num_threads=1)
        g2 = infinicp.Group(ctx2, comm)
        p2 = infinicp.AttnPlan(g2, "float32", 1, 16, 2, 2, 4)

        class Holder:
            pass

        h = Holder()
        h.me, h.plan, h.group, h.ctx = h, p2, g2, ctx2  # a cycle the collector breaks
        del h, p2, g2, ctx2
        return True

    assert infinicp.run_ranks(2, fn) == [True, True]
    gc.collect()
    assert infinicp.live_handles() == {}


def test_collector_anywhere():
    """The cycle collector may finalise wrappers at any point, also inside
    the package's own bookkeeping (Python 3.12 runs it between any two
    bytecodes): no deadlock, every handle released."""
    def fn(r, comm, n):
        for _ in range(n):
            ctx = infinicp.Context(num_threads=1)
            g = infinicp.Group(ctx, comm)
            plan = infinicp.AttnPlan(g, "float32", 1, 16, 2, 2, 4)
            q = np.zeros(plan.q_shape, np.float32)
            plan.forward(q, q, q)
            cycle = [plan, g, ctx]
            cycle.append(cycle)
            del cycle, plan, g, ctx

    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        infinicp.run_ranks(2, fn, 50)
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert infinicp.live_handles() == {}


def test_collector_inside_bookkeeping():
    """A collection that starts while the package updates its handle
    records (the lock held) and finalises other wrappers must not deadlock
    (run in a subprocess, so that a deadlock fails instead of hanging)."""
    code = textwrap.dedent("""
        import gc, infinicp
        keep = infinicp.Topology(2, cp=2)
        for i in range(20):
            gc.disable()
            garbage = [infinicp.Topology(2, cp=2), infinicp.Pack(2, [0, 4])]
            garbage.append(garbage)  # a cycle: only the collector frees it
            del garbage
            other = infinicp.Topology(2, cp=2)
            gc.set_threshold(1, 1, 1)
            gc.enable()
            other.close()  # allocates while the records are locked: the collector runs there
        gc.collect()
        keep.close()
        assert infinicp.live_handles() == {}, infinicp.live_handles()
        print("ok")
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT, env.get("PYTHONPATH", "")])
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a collection inside the package's bookkeeping never returned")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_context_manager_and_repr():
    with infinicp.Topology(4, cp=4) as t:
        assert "cp=4" in repr(t)
    assert t.closed
    t.close()  # idempotent
    comms = infinicp.local_world(1)
    with comms[0] as c:
        assert "rank=0" in repr(c)
    assert c.closed


# ---------------------------------------------------------------------------
# packaging details
# ---------------------------------------------------------------------------


def test_import_without_torch():
    """``import infinicp`` works where PyTorch cannot be imported."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # import torch now raises ImportError
        import infinicp
        assert not hasattr(infinicp, "torch")
        try:
            import infinicp.torch
        except ImportError:
            pass
        else:
            raise SystemExit("infinicp.torch imported without torch")
        print(infinicp.version())
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == infinicp.version()


def test_bad_library_path_says_so():
    code = "import infinicp; infinicp.version()"
    env = dict(os.environ, INFINICP_LIBRARY="/nonexistent/libinfinicp.so.1")
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "INFINICP_LIBRARY=/nonexistent/libinfinicp.so.1" in out.stderr


def test_struct_layout_matches_the_header(tmp_path):
    """The ctypes structures have the sizes and offsets of infinicp.h (needs
    a C compiler and the header of the tree)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    include = os.path.join(ROOT, "include")
    if not cc or not os.path.exists(os.path.join(include, "infinicp", "infinicp.h")):
        pytest.skip("no C compiler or no include/infinicp/infinicp.h")
    import ctypes

    from infinicp import _lib
    structs = {"ContextConfig": "cp_context_config", "TopologyConfig": "cp_topology_config",
               "Coords": "cp_coords", "GroupConfig": "cp_group_config", "AttnDescC": "cp_attn_desc",
               "PackConfig": "cp_pack_config", "AttnArgs": "cp_attn_args", "AttnRect": "cp_attn_rect",
               "KernelAttnArgs": "cp_kernel_attn_args", "KernelMergeArgs": "cp_kernel_merge_args"}
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <infinicp/infinicp.h>", "int main(void) {"]
    expect = []
    for py, c in structs.items():
        s = getattr(_lib, py)
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (c, c))
        expect.append("%s %d" % (c, ctypes.sizeof(s)))
        for field in s._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (c, field[0], c, field[0]))
            expect.append("%s.%s %d" % (c, field[0], getattr(s, field[0]).offset))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", include, str(src), "-o", str(exe)], check=True, capture_output=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [x for x in got if x] == expect


def test_bf16_conversion():
    x = np.array([1.0, -2.5, 3.140625, 1e-40, np.inf, -np.inf, 65504.0, 1.00390625], np.float32)
    bits = infinicp.float32_to_bf16_bits(x)
    assert bits.dtype == np.uint16
    back = infinicp.bf16_bits_to_float32(bits)
    np.testing.assert_array_equal(back[:3], [1.0, -2.5, 3.140625])
    assert np.isinf(back[4]) and np.isinf(back[5])
    assert back[7] == 1.0  # ties to even
    assert np.isnan(infinicp.bf16_bits_to_float32(infinicp.float32_to_bf16_bits(np.float32("nan"))))
