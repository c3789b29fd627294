# SPDX-License-Identifier: MIT
"""FP8 E4M3 (API 1.2) with PyTorch's torch.float8_e4m3fn on CPU contexts
and on one GPU (on Hopper the FP8 tensor-core kernel, elsewhere the SIMT
kernels): the plan's forward
and infinicp.torch.attention against a float64 reference of the decoded
values times the descales (per tensor and per head), bfloat16 outputs,
and the refusal of FP8 under autograd. Skipped without PyTorch, or with a
PyTorch that has no float8_e4m3fn; the GPU rows without a CUDA GPU."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this PyTorch has no torch.float8_e4m3fn", allow_module_level=True)

import infinicp  # noqa: E402
import infinicp.torch as icpt  # noqa: E402
from infinicp import Status  # noqa: E402
from refattn import TOL, reference, rel_rms  # noqa: E402


# On Hopper the FP8 kernel rounds the probabilities to E4M3 before P V
# (within 2^-4 relative, round to nearest: an RMS of at most 2^-4 / sqrt(3)
# of each), on top of the BF16 output's rounding.
TOL_CUDA_FP8 = 2.0 ** -4 / np.sqrt(3) + TOL["bfloat16"]


def fp8(rng, shape, amp):
    """A float8_e4m3fn tensor and its values in float64."""
    t = torch.from_numpy(rng.uniform(-amp, amp, shape).astype(np.float32)).to(torch.float8_e4m3fn)
    return t, t.to(torch.float64).numpy()


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    try:
        infinicp.Context("cuda").close()
    except infinicp.Error as e:
        pytest.skip("no CUDA context: %s" % e)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("mode", ["p2p", "a2a", "all_gather", "a2a_p2p"])
def test_attention_float8(mode, per_head, device):
    if device == "cuda":
        _cuda_or_skip()
    elif mode in ("all_gather", "a2a_p2p"):
        pytest.skip("on the CPU p2p and a2a stand for the modes (test-fp8 runs them all)")
    P, B, S, H, Hkv, D = (4 if mode == "a2a_p2p" else 2), 1, 32, 4, 2, 16
    rng = np.random.default_rng(3)
    q, qv = fp8(rng, (B, S, H, D), 8)
    k, kv = fp8(rng, (B, S, Hkv, D), 8)
    v, vv = fp8(rng, (B, S, Hkv, D), 200)
    qd = torch.tensor(rng.uniform(0.05, 0.3, H if per_head else 1), dtype=torch.float32)
    kd = torch.tensor(rng.uniform(0.1, 0.5, Hkv if per_head else 1), dtype=torch.float32)
    vd = 0.004  # a float: per tensor, or repeated per head beside per-head tensors
    scale = lambda x, d, h: x * np.broadcast_to(np.asarray(d, dtype=np.float64).reshape(-1), (h,))[None, None, :, None]  # noqa: E731
    ref = reference(scale(qv, qd.numpy(), H), scale(kv, kd.numpy(), Hkv), scale(vv, vd, Hkv),
                    np.zeros((B, S, H, D)), causal=True)

    ctx_kw = dict(device="cpu", num_threads=1) if device == "cpu" else dict(device="cuda")

    def rank_main(r, comm):
        with infinicp.Context(**ctx_kw) as ctx, \
                infinicp.Group(ctx, comm, a2a_size=2 if mode == "a2a_p2p" else 1) as group, \
                infinicp.AttnPlan(group, torch.float8_e4m3fn, B, S, H, Hkv, D, layout="zigzag", mode=mode) as plan:
            pos = torch.as_tensor(infinicp.layout_positions("zigzag", P, r, S))
            # this rank's tokens, moved as codes (indexing needs no float8 kernels)
            sh = [x.view(torch.uint8)[:, pos].contiguous().view(torch.float8_e4m3fn).to(device) for x in (q, k, v)]
            # on the GPU every descale a device tensor of one granularity
            vdt = vd if device == "cpu" else torch.full((Hkv if per_head else 1,), vd, device=device)
            with torch.no_grad():
                out = icpt.attention(*sh, plan, q_descale=qd.to(device), k_descale=kd.to(device), v_descale=vdt)
            assert out.dtype == torch.bfloat16 and tuple(out.shape) == plan.out_shape
            # q, k, v that require grad: FP8 plans are forward only
            with pytest.raises(infinicp.Error) as e:
                icpt.attention(sh[0].float().requires_grad_(), sh[1], sh[2], plan)
            assert e.value.status == Status.UNSUPPORTED and "forward only" in str(e.value)
            with pytest.raises(infinicp.Error) as e:
                plan.backward(sh[0], sh[1], sh[2], out, torch.zeros(plan.lse_shape, device=device), out)
            assert e.value.status == Status.UNSUPPORTED
            if device == "cuda":
                torch.cuda.synchronize()
            return out.cpu()

    outs = infinicp.run_ranks(P, rank_main)
    got = icpt.gather(outs, "zigzag", cp_size=P).to(torch.float64).numpy()
    assert rel_rms(got, ref["out"]) <= (TOL_CUDA_FP8 if device == "cuda" else TOL["bfloat16"])
