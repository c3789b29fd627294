# SPDX-License-Identifier: MIT
"""FP8 E4M3 (API 1.2) through the package on CPU contexts: the code
helpers against the format, uint8 codes with dtype "fp8_e4m3" in the
kernel call and in CP plans of every mode and layout (per-tensor and
per-head descales) against the FP64 reference, and the refusals: FP8
backward, descales of other plans, uint8 arrays without the dtype named.
PyTorch's float8_e4m3fn is test_fp8_torch.py's."""

import numpy as np
import pytest

import infinicp
from infinicp import Status
from refattn import TOL, doc_ids_of, reference, rel_rms

BF16_TOL = TOL["bfloat16"]  # FP8 plans write bfloat16


def decode(code):
    """A code's value from the format's definition, written apart from the package."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m / 8 * 2.0 ** -6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def test_code_helpers_match_the_format():
    codes = np.arange(256, dtype=np.uint8)
    got = infinicp.fp8_e4m3_bits_to_float32(codes)
    want = np.array([decode(c) for c in range(256)])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok].astype(np.float32))
    # every value converts back to its code (the NaN codes to the quiet one of their sign)
    back = infinicp.float32_to_fp8_e4m3_bits(got)
    np.testing.assert_array_equal(back[ok], codes[ok])
    assert back[0x7F] == 0x7F and back[0xFF] == 0xFF
    # ties to even, no infinity: beyond 464 is NaN
    x = np.array([464, 465, 460, 480, 2.0 ** -10, 3 * 2.0 ** -10, np.inf, -np.inf, -0.0])
    assert list(infinicp.float32_to_fp8_e4m3_bits(x)) == [0x7E, 0x7F, 0x7E, 0x7F, 0x00, 0x02, 0x7F, 0xFF, 0x80]
    with pytest.raises(infinicp.ArgumentError):
        infinicp.fp8_e4m3_bits_to_float32(np.zeros(3, dtype=np.int16))


def test_kernel_passes_every_code():
    """One key: O is its value row, every code through the library's loads."""
    ctx = infinicp.Context("cpu", num_threads=1)
    one = np.full((1, 1, 1, 1), 0x38, dtype=np.uint8)  # 1.0
    v = np.arange(256, dtype=np.uint8).reshape(1, 1, 1, 256)
    out, lse = infinicp.kernel_attention_forward(ctx, one, one, v, dtype="fp8_e4m3")
    assert out.dtype == np.uint16  # bfloat16 bits
    got = infinicp.bf16_bits_to_float32(out).reshape(-1)
    want = np.array([decode(c) for c in range(256)])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    assert lse.reshape(-1)[0] == 1.0
    ctx.close()


def fp8_data(rng, shape, amp, descale):
    """(uint8 codes, their real values: decoded values times the descale per head)."""
    heads = shape[2]
    d = np.broadcast_to(np.asarray(descale, dtype=np.float32).reshape(-1), (heads,)).astype(np.float64)
    codes = infinicp.float32_to_fp8_e4m3_bits(rng.uniform(-amp, amp, shape))
    vals = infinicp.fp8_e4m3_bits_to_float32(codes).astype(np.float64) * d[None, None, :, None]
    return codes, vals


def fp8_qkv(rng, B, S, H, Hkv, D, per_head):
    """(codes, values, descales) of q, k and v: descales per head or one
    each, values the decoded codes times them."""
    qd = rng.uniform(0.05, 0.3, H if per_head else 1).astype(np.float32)
    kd = rng.uniform(0.1, 0.5, Hkv if per_head else 1).astype(np.float32)
    vd = rng.uniform(1e-3, 1e-2, Hkv if per_head else 1).astype(np.float32)
    q, qv = fp8_data(rng, (B, S, H, D), 8, qd)
    k, kv = fp8_data(rng, (B, S, Hkv, D), 8, kd)
    v, vv = fp8_data(rng, (B, S, Hkv, D), 200, vd)
    return (q, qv, qd), (k, kv, kd), (v, vv, vd)


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_kernel_forward(per_head):
    rng = np.random.default_rng(1)
    B, S, H, Hkv, D = 2, 40, 4, 2, 16
    (q, qv, qd), (k, kv, kd), (v, vv, vd) = fp8_qkv(rng, B, S, H, Hkv, D, per_head)
    ref = reference(qv, kv, vv, np.zeros((B, S, H, D)), causal=True)
    ctx = infinicp.Context("cpu", num_threads=2)
    descales = (qd, kd, vd) if per_head else (float(qd[0]), kd, float(vd[0]))  # numbers or arrays
    out, lse = infinicp.kernel_attention_forward(ctx, q, k, v, dtype="fp8_e4m3", q_descale=descales[0],
                                                 k_descale=descales[1], v_descale=descales[2])
    assert rel_rms(infinicp.bf16_bits_to_float32(out), ref["out"]) <= BF16_TOL
    assert rel_rms(lse, ref["lse"]) <= 2e-5
    # uint8 arrays hold FP8 codes only where the caller says so
    with pytest.raises(infinicp.ArgumentError, match="fp8_e4m3"):
        infinicp.kernel_attention_forward(ctx, q, k, v)
    with pytest.raises(infinicp.ArgumentError, match="descales are for FP8"):
        infinicp.kernel_attention_forward(ctx, qv.astype(np.float32), kv.astype(np.float32),
                                          vv.astype(np.float32), q_descale=0.5)
    with pytest.raises(infinicp.ArgumentError, match="k_descale has 3 values"):
        infinicp.kernel_attention_forward(ctx, q, k, v, dtype="fp8_e4m3", k_descale=[1, 2, 3])
    # forward only
    with pytest.raises(infinicp.Error) as e:
        infinicp.kernel_attention_backward(ctx, q, k, v, out, lse, out, dtype="fp8_e4m3")
    assert e.value.status == Status.UNSUPPORTED and "forward only" in str(e.value)
    with pytest.raises(infinicp.ArgumentError, match="fp8_e4m3"):
        infinicp.kernel_attention_backward(ctx, q, k, v, out, lse, out)
    ctx.close()


def run_fp8(P, mode, layout, causal=True, per_head=False, Hkv=2, window=0, softcap=0.0, sinks=False, fmt="bshd",
            seed=0):
    """One FP8 forward on P in-process ranks; (reference, gathered out and lse)."""
    rng = np.random.default_rng(seed)
    B, S, H, D = (1 if layout == "packed" else 2), 32, 4, 16
    cu = [0, 5, 15, 16, S] if layout == "packed" else None
    (q, qv, qd), (k, kv, kd), (v, vv, vd) = fp8_qkv(rng, B, S, H, Hkv, D, per_head)
    sink_logits = rng.standard_normal(H).astype(np.float32) if sinks else None
    ref = reference(qv, kv, vv, np.zeros((B, S, H, D)), causal, 0.0, window, softcap,
                    None if sink_logits is None else sink_logits.astype(np.float64),
                    doc_ids_of(cu) if cu else None)

    def local(x, pos):
        part = x[:, pos]
        return np.ascontiguousarray(part.transpose(1, 0, 2, 3) if fmt == "sbhd" else part)

    def rank_main(r, comm):
        with infinicp.Context("cpu", num_threads=1) as ctx, \
                infinicp.Group(ctx, comm, a2a_size=2 if mode == "a2a_p2p" else 1) as group, \
                infinicp.AttnPlan(group, "fp8_e4m3", B, S, H, Hkv, D, 0, causal, layout, mode, fmt, 0.0, window,
                                  softcap, sinks) as plan:
            assert plan.out_dtype == "bfloat16"
            pack = infinicp.Pack(P, cu, causal=causal, window=window) if cu else None
            pos = pack.positions(r) if pack else infinicp.layout_positions(layout, P, r, S)
            out, lse = plan.forward(local(q, pos), local(k, pos), local(v, pos), pack=pack, sinks=sink_logits,
                                    q_descale=qd, k_descale=kd, v_descale=vd)
            if pack:
                pack.close()
            return pos, out, lse

    got_out = np.full(ref["out"].shape, np.nan)
    got_lse = np.full(ref["lse"].shape, np.nan)
    for pos, out, lse in infinicp.run_ranks(P, rank_main):
        assert out.dtype == np.uint16
        o = infinicp.bf16_bits_to_float32(out).astype(np.float64)
        got_out[:, pos] = o.transpose(1, 0, 2, 3) if fmt == "sbhd" else o
        got_lse[:, :, pos] = lse
    return ref, got_out, got_lse


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "packed"])
@pytest.mark.parametrize("mode", ["all_gather", "p2p", "a2a", "a2a_p2p"])
def test_cp_modes_layouts(mode, layout):
    """CP=1 and CP=4: within the bound, and CP adds no error (1.25x)."""
    per_head = len(mode + layout) % 2 == 0
    kw = dict(per_head=per_head, Hkv=2 if mode != "a2a_p2p" else 4, sinks=layout == "zigzag",
              window=7 if layout == "packed" else 0, softcap=2.0 if mode == "p2p" else 0.0,
              fmt="sbhd" if layout == "contiguous" else "bshd", seed=len(mode) * 3 + len(layout))
    ref, o1, l1 = run_fp8(1, "p2p" if mode == "a2a_p2p" else mode, layout, **kw)
    ref, o4, l4 = run_fp8(4, mode, layout, **kw)
    e1, e4 = rel_rms(o1, ref["out"]), rel_rms(o4, ref["out"])
    assert e1 <= BF16_TOL, "CP=1 out error %.3g" % e1
    assert e4 <= 1.25 * e1 + 1e-6, "CP=4 out error %.4g vs %.4g at CP=1" % (e4, e1)
    assert rel_rms(l4, ref["lse"]) <= 1.25 * rel_rms(l1, ref["lse"]) + 1e-9


def test_plan_refusals():
    def rank_main(r, comm):
        with infinicp.Context("cpu", num_threads=1) as ctx, infinicp.Group(ctx, comm) as group:
            plan = infinicp.AttnPlan(group, "fp8", batch=1, seq_len=16, num_heads=2, head_dim=8)
            q = np.full(plan.q_shape, 0x38, dtype=np.uint8)
            out, lse = plan.forward(q, q, q)  # descales 1
            errors = []
            # forward only, on every rank, none waiting for a timeout
            with pytest.raises(infinicp.Error) as e:
                plan.backward(q, q, q, out, lse, out)
            errors.append((e.value.status, str(e.value)))
            with pytest.raises(infinicp.ArgumentError, match="q_descale has 5 values"):
                plan.forward(q, q, q, q_descale=np.ones(5, dtype=np.float32))
            with pytest.raises(infinicp.ArgumentError, match="has dtype int8"):
                plan.forward(q.view(np.int8), q, q)
            plan.forward(q, q, q, q_descale=0.5, k_descale=np.float32(2), v_descale=[1.0, 2.0])
            bf = infinicp.AttnPlan(group, "bfloat16", batch=1, seq_len=16, num_heads=2, head_dim=8)
            with pytest.raises(infinicp.ArgumentError, match="descales are for FP8 plans"):
                bf.forward(np.zeros(bf.q_shape, np.uint16), np.zeros(bf.k_shape, np.uint16),
                           np.zeros(bf.v_shape, np.uint16), v_descale=2.0)
            bf.close()
            plan.close()
            return errors

    for errors in infinicp.run_ranks(2, rank_main):
        status, message = errors[0]
        assert status == Status.UNSUPPORTED and "forward only" in message


def test_ml_dtypes_arrays():
    ml = pytest.importorskip("ml_dtypes")
    ctx = infinicp.Context("cpu", num_threads=1)
    one = np.ones((1, 1, 1, 4), dtype=ml.float8_e4m3fn)
    out, _ = infinicp.kernel_attention_forward(ctx, one, one, one)
    assert out.dtype == np.dtype(ml.bfloat16)
    np.testing.assert_array_equal(out.astype(np.float32), np.ones((1, 1, 1, 4), np.float32))
    ctx.close()
