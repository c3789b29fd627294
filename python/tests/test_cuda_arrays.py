# SPDX-License-Identifier: MIT
"""CUDA arrays that are not PyTorch tensors: CuPy arrays, objects that only
have ``__cuda_array_interface__`` and objects that only speak DLPack.

AttnPlan forward and backward on CUDA contexts, CP = 1 and CP = 4 on one
GPU (in-process ranks, each with a CuPy stream of its own), float16 and
bfloat16 (CuPy has no bfloat16: ``uint16`` arrays of bf16 bits, as NumPy
takes them), against the NumPy FP64 reference of refattn.py within the CPU
suite's bounds; outputs must be CuPy arrays on the inputs' device. Arrays
on the wrong device (a CUDA array on a CPU context, a NumPy array on a CUDA
context) must raise ArgumentError naming the argument.

Skipped without CuPy, without a CUDA GPU, or without the library's CUDA
module (each test says which).
"""

import functools

import numpy as np
import pytest

try:
    cupy = pytest.importorskip("cupy")
except Exception as e:  # noqa: BLE001 - installed but unusable (no CUDA libraries)
    pytest.skip("CuPy does not import: %s" % e, allow_module_level=True)

import infinicp  # noqa: E402
from refattn import check_close, reference, to_storage, values  # noqa: E402

KINDS = ["cupy", "cai", "dlpack"]


class CAIOnly:
    """A CUDA array that has only ``__cuda_array_interface__`` (as Numba's
    and other libraries' arrays), over a CuPy array."""

    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


class DLPackOnly:
    """A CUDA array that only speaks DLPack (as JAX's), over a CuPy array.
    The consumer's stream is handed on to CuPy."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def as_kind(a, kind):
    """The CuPy array ``a`` as an array of ``kind``."""
    return {"cupy": a, "cai": CAIOnly(a), "dlpack": DLPackOnly(a)}[kind]


def to_device(x, stream, keep):
    """A CuPy copy of the NumPy array ``x``, copied on ``stream`` (the host
    copy goes to ``keep``: alive until the stream has run the copy)."""
    x = np.ascontiguousarray(x)
    keep.append(x)
    a = cupy.empty(x.shape, dtype=x.dtype)
    a.set(x, stream=stream)
    return a


def to_host(a, stream):
    """The NumPy copy of the CuPy array ``a`` once ``stream``'s work is done."""
    stream.synchronize()
    h = a.get(stream=stream)
    stream.synchronize()
    return h


# ---------------------------------------------------------------------------
# What the machine has
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _gpu_missing():
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver, no device
        return "no CUDA GPU (%s)" % e
    return None if n > 0 else "no CUDA GPU"


@functools.lru_cache(maxsize=None)
def _cuda_context_missing():
    try:
        infinicp.Context("cuda").close()
    except infinicp.Error as e:
        return "no CUDA context (the library's CUDA module): %s" % e
    return None


def _gpu_or_skip():
    why = _gpu_missing()
    if why:
        pytest.skip(why)


def _cuda_or_skip():
    _gpu_or_skip()
    why = _cuda_context_missing()
    if why:
        pytest.skip(why)


# ---------------------------------------------------------------------------
# CP attention on CUDA arrays against the FP64 reference
# ---------------------------------------------------------------------------

B, S, H, HKV, D = 2, 512, 8, 4, 64


@functools.lru_cache(maxsize=None)
def problem(dtype, seed=0):
    """Whole-sequence inputs in the storage type (NumPy) and the FP64
    reference of their attention and gradients (causal, GQA)."""
    rng = np.random.default_rng(seed)
    q_s, q = to_storage(rng.standard_normal((B, S, H, D)), dtype)
    k_s, k = to_storage(rng.standard_normal((B, S, HKV, D)), dtype)
    v_s, v = to_storage(rng.standard_normal((B, S, HKV, D)), dtype)
    do_s, do = to_storage(rng.standard_normal((B, S, H, D)), dtype)
    return (q_s, k_s, v_s, do_s), reference(q, k, v, do, causal=True)


def run_cp_cuda(P, kind, dtype, mode="p2p", layout="zigzag"):
    """CP attention on P in-process ranks on GPU 0, inputs of ``kind``;
    returns (reference, gathered results) as float64 dicts, as refattn.run_cp."""
    (q_s, k_s, v_s, do_s), ref = problem(dtype)
    storage = np.float16 if dtype == "float16" else np.uint16  # bf16: uint16 bits

    def check_output(x, name, shape, dt):
        assert isinstance(x, cupy.ndarray), "%s: %s is a %s, not a CuPy array" % (kind, name, type(x).__name__)
        assert x.device.id == 0, "%s: %s is on GPU %d, the inputs on 0" % (kind, name, x.device.id)
        assert x.shape == tuple(shape) and x.dtype == dt, "%s: %s is %s %s" % (kind, name, x.dtype, x.shape)

    def rank_main(r, comm):
        stream = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.Device(0), stream, \
                infinicp.Context("cuda", 0, stream=stream) as ctx, \
                infinicp.Group(ctx, comm, a2a_size=2 if mode == "a2a_p2p" else 1) as group, \
                infinicp.AttnPlan(group, dtype, B, S, H, HKV, D, causal=True, layout=layout, mode=mode) as plan:
            assert ctx.stream == stream.ptr
            pos = infinicp.layout_positions(layout, P, r, S)
            hosts = []
            dev = [to_device(x[:, pos], stream, hosts) for x in (q_s, k_s, v_s, do_s)]
            ql, kl, vl, dl = (as_kind(a, kind) for a in dev)
            out, lse = plan.forward(ql, kl, vl)
            check_output(out, "out", plan.out_shape, storage)
            check_output(lse, "lse", plan.lse_shape, np.float32)
            # the forward's outputs as they came back (CuPy) with the inputs of kind
            grads = plan.backward(ql, kl, vl, out, lse, dl)
            assert len(grads) == 3
            for name, g, shape in zip(("dq", "dk", "dv"), grads, (plan.q_shape, plan.k_shape, plan.v_shape)):
                check_output(g, name, shape, storage)
            host = [to_host(a, stream) for a in (out, lse) + tuple(grads)]
            del dev, ql, kl, vl, dl, out, lse, grads, hosts
        return pos, host

    results = infinicp.run_ranks(P, rank_main)
    got = {n: np.full_like(ref[n], np.nan) for n in ("out", "lse", "dq", "dk", "dv")}
    for pos, (out, lse, dq, dk, dv) in results:
        got["out"][:, pos] = values(out, dtype)
        got["lse"][:, :, pos] = lse
        got["dq"][:, pos] = values(dq, dtype)
        got["dk"][:, pos] = values(dk, dtype)
        got["dv"][:, pos] = values(dv, dtype)
    return ref, got


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("P", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_attention_cuda_arrays(kind, P, dtype):
    """CuPy, __cuda_array_interface__-only and DLPack-only inputs: forward
    and backward at CP = 1 and CP = 4 (zigzag, p2p) on one GPU."""
    _cuda_or_skip()
    ref, got = run_cp_cuda(P, kind, dtype, layout="zigzag" if P > 1 else "contiguous")
    check_close(ref, got, dtype, "%s P=%d" % (kind, P))


@pytest.mark.parametrize("mode", ["all_gather", "a2a", "a2a_p2p"])
def test_attention_cupy_modes(mode):
    """The other CP modes on CuPy arrays, CP = 4 on one GPU, float16."""
    _cuda_or_skip()
    ref, got = run_cp_cuda(4, "cupy", "float16", mode=mode)
    check_close(ref, got, "float16", "cupy %s" % mode)


# ---------------------------------------------------------------------------
# Arrays on the wrong device
# ---------------------------------------------------------------------------


def _raises_naming(fn, what):
    with pytest.raises(infinicp.Error, match=what) as ei:
        fn()
    assert isinstance(ei.value, infinicp.ArgumentError)
    assert ei.value.status == infinicp.Status.INVALID_ARGUMENT
    return ei.value


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_array_on_cpu_context(kind):
    """A CUDA array passed to a plan on a CPU context raises ArgumentError
    naming it; the next call with NumPy arrays works."""
    _gpu_or_skip()

    def fn(r, comm):
        with cupy.cuda.Device(0), infinicp.Context("cpu", num_threads=1) as ctx, \
                infinicp.Group(ctx, comm) as group, \
                infinicp.AttnPlan(group, "float16", 1, 64, 2, 2, 16) as plan:
            q = np.zeros(plan.q_shape, np.float16)
            kd = as_kind(cupy.zeros(plan.k_shape, cupy.float16), kind)
            e = _raises_naming(lambda: plan.forward(q, kd, q), r"AttnPlan\.forward: k is on cuda")
            assert "context on cpu" in str(e)
            out, lse = plan.forward(q, q, q)
            assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
            dd = as_kind(cupy.zeros(plan.out_shape, cupy.float16), kind)
            _raises_naming(lambda: plan.backward(q, q, q, out, lse, dd), r"AttnPlan\.backward: dout is on cuda")
            cupy.cuda.Device(0).synchronize()
        return True

    assert infinicp.run_ranks(1, fn) == [True]


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_array_on_cuda_context(kind):
    """A NumPy array passed to a plan on a CUDA context raises ArgumentError
    naming it, so does a CUDA array that is not C-contiguous; the next call
    with CUDA arrays works."""
    _cuda_or_skip()

    def fn(r, comm):
        stream = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.Device(0), stream, infinicp.Context("cuda", 0, stream=stream) as ctx, \
                infinicp.Group(ctx, comm) as group, \
                infinicp.AttnPlan(group, "float16", 1, 128, 2, 2, 64) as plan:
            qd = as_kind(cupy.zeros(plan.q_shape, cupy.float16), kind)
            v_np = np.zeros(plan.v_shape, np.float16)
            e = _raises_naming(lambda: plan.forward(qd, qd, v_np), r"AttnPlan\.forward: v is on cpu")
            assert "context on cuda:0" in str(e)
            e = _raises_naming(lambda: plan.forward(np.zeros(plan.q_shape, np.float16), qd, qd),
                               r"AttnPlan\.forward: q is on cpu")
            b, t, h, d = plan.k_shape
            strided = as_kind(cupy.zeros((b, t, d, h), cupy.float16).transpose(0, 1, 3, 2), kind)
            _raises_naming(lambda: plan.forward(qd, strided, qd), r"AttnPlan\.forward: k is not C-contiguous")
            out, lse = plan.forward(qd, qd, qd)
            assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
            _raises_naming(lambda: plan.backward(qd, qd, qd, out, to_host(lse, stream), out),
                           r"AttnPlan\.backward: lse is on cpu")
            dq, dk, dv = plan.backward(qd, qd, qd, out, lse, out)
            assert all(isinstance(g, cupy.ndarray) for g in (dq, dk, dv))
            stream.synchronize()
        return True

    assert infinicp.run_ranks(1, fn) == [True]
