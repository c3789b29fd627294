# SPDX-License-Identifier: MIT
"""infinicp.torch: the autograd layer against PyTorch's SDPA math backend
in float64, shard / gather, and nccl_group. Skipped without PyTorch; the
CUDA tests are skipped without a GPU, the CUDA module or NCCL."""

import pytest

torch = pytest.importorskip("torch")

import infinicp  # noqa: E402
import infinicp.torch as icpt  # noqa: E402
from refattn import doc_ids_of, visible  # noqa: E402

F = torch.nn.functional


def sdpa_reference(q, k, v, causal=True, window=0, doc_ids=None, scale=None, sinks=None, softcap=0.0):
    """float64 attention of [B, S, H, D] tensors through SDPA's math backend
    (sinks through an extra key column of zero value; a softcap c as
    c * tanh(s / c) on the scaled scores, written out)."""
    B, S, H, D = q.shape
    grp = H // k.shape[2]
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k.repeat_interleave(grp, 2), v.repeat_interleave(grp, 2)))
    mask = torch.as_tensor(visible(S, causal, window, doc_ids), device=q.device)
    if sinks is None and not softcap:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            ctx = sdpa_kernel(SDPBackend.MATH)
        except ImportError:  # older PyTorch
            ctx = torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False, enable_math=True)
        with ctx:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        return out.transpose(1, 2)
    scale = scale or D ** -0.5
    s = torch.einsum("bhid,bhjd->bhij", qh, kh) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf"))
    if sinks is None:
        p = torch.softmax(s, -1).nan_to_num(0.0)  # rows without keys: 0
    else:
        sink_col = sinks.to(s.dtype).view(1, H, 1, 1).expand(B, H, S, 1)
        p = torch.softmax(torch.cat([s, sink_col], -1), -1)[..., :S]
    return torch.einsum("bhij,bhjd->bhid", p, vh).transpose(1, 2)


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm())


def run_cp_torch(P, device="cpu", dtype=torch.float32, mode="p2p", layout="zigzag", causal=True, window=0,
                 sinks=False, H=4, Hkv=2, D=16, S=64, B=2, cu=None, streams=False, softcap=0.0):
    """CP attention through infinicp.torch on P in-process ranks; returns
    the reference and gathered (out, dq, dk, dv, dsinks)."""
    if layout == "packed":
        B = 1
        cu = cu or [0, 7, 30, 31, S]
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv, H))
    sink = torch.randn(H, generator=g, dtype=torch.float64) if sinks else None
    q, k, v = (x.to(dtype).double() for x in (q, k, v))  # inputs representable in the storage type
    leaves = [x.clone().requires_grad_() for x in (q, k, v)] + ([sink.clone().requires_grad_()] if sinks else [])
    ref_out = sdpa_reference(*leaves[:3], causal=causal, window=window,
                             doc_ids=doc_ids_of(cu) if cu else None, sinks=leaves[3] if sinks else None,
                             softcap=softcap)
    (ref_out * w).sum().backward()
    ref = [ref_out.detach()] + [x.grad for x in leaves]
    results = [None] * P

    def rank_main(r, comm):
        stream = torch.cuda.Stream(device) if streams else None
        ctx_kw = dict(device=device, num_threads=1) if device == "cpu" else dict(device=device)
        with infinicp.Context(**ctx_kw) as ctx, infinicp.Group(ctx, comm, a2a_size=2 if mode == "a2a_p2p" else 1) as grp:
            dt = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
            plan = infinicp.AttnPlan(grp, dt, B, S, H, Hkv, D, causal=causal, layout=layout, mode=mode,
                                     window=window, sinks=sinks, softcap=softcap)
            pack = infinicp.Pack(P, cu, causal=causal, window=window) if layout == "packed" else None
            where = pack if pack is not None else plan
            with torch.cuda.stream(stream) if streams else _nothing():
                ql, kl, vl = (icpt.shard(x.to(dtype).to(device), where, r).detach().requires_grad_() for x in (q, k, v))
                wl = icpt.shard(w.to(dtype).to(device), where, r)
                sl = sink.float().to(device).clone().requires_grad_() if sinks else None
                out = icpt.attention(ql, kl, vl, plan, pack=pack, sinks=sl)
                loss = (out.float() * wl.float()).sum()
                if device == "cpu":
                    loss.backward()
                else:  # every rank's CUDA backward on its own thread, not the device's one
                    with torch.autograd.set_multithreading_enabled(False):
                        loss.backward()
                if streams:
                    stream.synchronize()
            results[r] = (out.detach().cpu(), ql.grad.cpu(), kl.grad.cpu(), vl.grad.cpu(),
                          None if not sinks else sl.grad.cpu().clone())
            plan.close()

    infinicp.run_ranks(P, rank_main)
    # the same split as the ranks': a pack balances for its mask and window
    where = infinicp.Pack(P, cu, causal=causal, window=window) if layout == "packed" else layout
    kw = {} if layout == "packed" else dict(cp_size=P)
    got = [icpt.gather([res[i] for res in results], where, **kw) for i in range(4)]
    if sinks:
        got.append(sum(res[4] for res in results))
    return ref, got


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "packed"])
@pytest.mark.parametrize("mode", ["all_gather", "p2p", "a2a", "a2a_p2p"])
def test_attention_cpu_against_sdpa(mode, layout):
    torch.set_num_threads(1)
    ref, got = run_cp_torch(4, mode=mode, layout=layout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel(a, b) < 1e-5, name


def test_attention_cpu_window_sinks():
    ref, got = run_cp_torch(2, mode="p2p", layout="packed", window=5, sinks=True)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dsinks"), got, ref):
        assert rel(a, b) < 1e-5, name


def test_shard_gather_differentiable():
    x = torch.randn(2, 16, 3, dtype=torch.float64, requires_grad=True)
    parts = [icpt.shard(x, "zigzag", r, dim=1, cp_size=4) for r in range(4)]
    back = icpt.gather(parts, "zigzag", dim=1)
    assert torch.equal(back, x)
    back.pow(2).sum().backward()
    assert torch.allclose(x.grad, 2 * x)
    pos = infinicp.layout_positions("zigzag", 4, 1, 16)
    assert torch.equal(parts[1], x[:, torch.as_tensor(pos)])


def test_gather_collective():
    def fn(r, comm):
        with infinicp.Context(num_threads=1) as ctx, infinicp.Group(ctx, comm) as g, \
                infinicp.AttnPlan(g, "float32", 1, 16, 2, 2, 4, layout="zigzag") as plan:
            x = torch.arange(16 * 5, dtype=torch.float32).view(1, 16, 5)
            whole = icpt.gather(icpt.shard(x, plan, r), plan)
            assert isinstance(whole, torch.Tensor) and torch.equal(whole, x)
            return True

    assert infinicp.run_ranks(2, fn) == [True, True]


def test_attention_rejects_non_plan():
    with pytest.raises(infinicp.ArgumentError):
        icpt.attention(torch.zeros(1), torch.zeros(1), torch.zeros(1), plan=None)


# ---------------------------------------------------------------------------
# CUDA (the device machine)
# ---------------------------------------------------------------------------


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    try:
        infinicp.Context("cuda").close()
    except infinicp.Error as e:
        pytest.skip("no CUDA context: %s" % e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["p2p", "a2a", "all_gather", "a2a_p2p"])
def test_attention_cuda_cp4_one_gpu(mode, dtype):
    """CP = 4 on one GPU: in-process ranks, each on a stream of its own."""
    _cuda_or_skip()
    ref, got = run_cp_torch(4, device="cuda", dtype=dtype, mode=mode, layout="zigzag", H=8, Hkv=4, D=64, S=512,
                            streams=True)
    bound = 4 * 2.0 ** -8 if dtype == torch.bfloat16 else 4 * 2.0 ** -11
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel(a, b) < bound, name


@pytest.mark.parametrize("P", [1, 4])
@pytest.mark.parametrize("case", ["packed", "packed_window", "zigzag_window", "packed_softcap", "packed_d128",
                                  "packed_sinks", "zigzag_sinks"])
@pytest.mark.parametrize("mode", ["p2p", "a2a", "all_gather", "a2a_p2p"])
def test_attention_cuda_api11_one_gpu(mode, case, P):
    """API 1.1 on one GPU: packed documents, windows, softcaps and sinks through
    the CUDA module's rectangle kernels, CP = 1 and CP = 4 (a stream per
    rank), bf16, forward and gradients against SDPA's math in float64."""
    _cuda_or_skip()
    if P == 1 and mode != "p2p":
        pytest.skip("one rank: the mode does not matter")
    S = 1024
    kw = dict(layout="zigzag" if case.startswith("zigzag") else "packed", H=8, Hkv=4, D=128 if case == "packed_d128"
              else 64, S=S, streams=True)
    if kw["layout"] == "packed":
        kw["cu"] = [0, 300, 301, 700, 765, S]  # one document of a single token, none a tile multiple
    if case.endswith("window"):
        kw["window"] = 100
    if case.endswith("softcap"):
        kw["softcap"] = 5.0
    if case.endswith("sinks"):  # since 1.2: the merge and the rowsums on the device
        kw["sinks"] = True
    ref, got = run_cp_torch(P, device="cuda", dtype=torch.bfloat16, mode=mode, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dsinks"), got, ref):
        assert rel(a, b) < 4 * 2.0 ** -8, name


def test_nccl_group_one_gpu(tmp_path):
    """nccl_group over a one-process NCCL process group."""
    _cuda_or_skip()
    if not infinicp.have_nccl_id():
        pytest.skip("the library has no cp_nccl_unique_id")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("no NCCL in this PyTorch")
    dist.init_process_group("nccl", init_method="file://%s" % (tmp_path / "rdzv"), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        group = icpt.nccl_group(None, "cuda:0")
        assert group.size == 1 and group.rank == 0 and group.context.device == "cuda"
        with infinicp.AttnPlan(group, "bfloat16", 1, 256, 4, 4, 64) as plan:
            g = torch.Generator().manual_seed(1)
            q, k, v = (torch.randn(1, 256, 4, 64, generator=g).bfloat16() for _ in range(3))
            qc, kc, vc = (x.cuda().requires_grad_() for x in (q, k, v))
            out = icpt.attention(qc, kc, vc, plan)
            out.float().sum().backward()
            ref = sdpa_reference(*(x.double() for x in (q, k, v)))
            assert rel(out, ref) < 4 * 2.0 ** -8
            assert qc.grad is not None and torch.isfinite(qc.grad.float()).all()
        group.close()
        group.comm.close()
        group.context.close()
    finally:
        dist.destroy_process_group()
