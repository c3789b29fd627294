# SPDX-License-Identifier: MIT
"""infinicp.torch: CP attention as one PyTorch autograd call.

Needs PyTorch (any version with ``torch.autograd.Function``); nothing here
is compiled against it. ``import infinicp`` never imports this module;
``import infinicp.torch`` or the attribute ``infinicp.torch`` does.

- :func:`attention`: CP attention of this rank's q, k, v under a plan,
  differentiable in q, k, v and the sinks.
- :func:`shard` / :func:`gather`: a rank's tokens of a whole sequence and
  back, by the plan's layout or pack (differentiable index operations).
- :func:`nccl_group`: the library's own NCCL communicator over a
  ``torch.distributed`` process group, as an :class:`infinicp.Group`.

Tensors: CPU tensors go to CPU contexts, CUDA tensors to CUDA contexts
(work is ordered on PyTorch's current stream, which is set on the plan's
context before every call). A plan's sink logits live on its device too.

FP8 (API 1.2): a plan of dtype ``"fp8_e4m3"`` takes ``torch.float8_e4m3fn``
q, k, v with their descales and returns bfloat16; it is forward only (CPU
contexts for now): under autograd, inputs that require grad are refused.
"""

import torch

from . import _core
from ._lib import Error, Status, argument_error

__all__ = ["attention", "shard", "gather", "nccl_group", "Attention"]


def _use_current_stream(plan, t):
    """Order the plan's work on PyTorch's current stream of t's device."""
    ctx = plan.group.context
    if ctx.device == "cuda" and t.is_cuda:
        s = torch.cuda.current_stream(t.device).cuda_stream
        if ctx.stream != (s or None):
            ctx.set_stream(s)


def _sinks_arg(sinks):
    if sinks is None:
        return None
    s = sinks.detach()
    if s.dtype != torch.float32:
        s = s.float()
    return s.contiguous()


def _fp8_forward_only(plan, what):
    return Error(Status.UNSUPPORTED, "%s: the plan's dtype is fp8_e4m3 (torch.float8_e4m3fn): FP8 plans are forward "
                 "only (API 1.2), so q, k, v, sinks and descales must not require grad (detach them, or run under "
                 "torch.no_grad())" % what)


class Attention(torch.autograd.Function):
    """The autograd function behind :func:`attention`:
    ``Attention.apply(q, k, v, sinks, plan, pack, descales)`` (descales: a
    tuple ``(q_descale, k_descale, v_descale)`` or None)."""

    @staticmethod
    def forward(fctx, q, k, v, sinks, plan, pack, descales=None):
        _use_current_stream(plan, q)
        qc, kc, vc = (t.detach().contiguous() for t in (q, k, v))
        s = _sinks_arg(sinks)
        ds = {}
        if descales is not None:
            ds = {n: (d.detach() if isinstance(d, torch.Tensor) else d)
                  for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)}
        out, lse = plan.forward(qc, kc, vc, pack=pack, sinks=s, **ds)
        fctx.fp8 = plan.desc.dtype == _core._FP8
        if fctx.fp8:
            fctx.mark_non_differentiable(out)
            return out
        fctx.save_for_backward(qc, kc, vc, out, lse, s)
        fctx.plan = plan
        fctx.pack = pack
        fctx.sinks_dtype = None if sinks is None else sinks.dtype
        return out

    @staticmethod
    def backward(fctx, dout):
        if fctx.fp8:
            raise _fp8_forward_only(None, "infinicp.torch.attention")
        qc, kc, vc, out, lse, s = fctx.saved_tensors
        plan = fctx.plan
        _use_current_stream(plan, dout)  # autograd runs it on the forward's stream
        res = plan.backward(qc, kc, vc, out, lse, dout.contiguous(), pack=fctx.pack, sinks=s)
        dsinks = None
        if s is not None and fctx.needs_input_grad[3]:
            dsinks = res[3].to(fctx.sinks_dtype)
        return res[0], res[1], res[2], dsinks, None, None, None


def attention(q, k, v, plan, pack=None, sinks=None, q_descale=None, k_descale=None, v_descale=None):
    """CP attention of this rank's tokens (collective over the plan's
    group): returns ``out`` for q, differentiable in q, k, v and ``sinks``.

    q, k, v: this rank's tokens in the plan's format, dtype and device
    (``plan.q_shape``, ...; made contiguous if they are not). ``pack``: the
    :class:`infinicp.Pack` of a packed plan. ``sinks``: the [num_heads]
    sink logits of a plan with sinks (float32, on the plan's device; its gradient is this
    rank's share: sum it over the DPxCP group like any replicated
    parameter's gradient). The backward calls the library's backward with
    the saved out and lse on the stream autograd runs it on. ``q_descale``, ``k_descale``,
    ``v_descale``: an FP8 plan's descales (floats, or tensors of one value
    or of one per head), as for :meth:`infinicp.AttnPlan.forward`; its
    output is bfloat16 and has no gradient (FP8 plans are forward only).

    Every rank must run its forward and its backward at the same time as
    the others (one thread or process per rank). In-process ranks on one
    GPU: PyTorch runs all CUDA backward work of a device on one thread,
    which would serialise the ranks' backward calls; run each rank's
    ``backward()`` inside ``torch.autograd.set_multithreading_enabled(False)``
    (PyTorch 2.0+) so that it runs on the rank's own thread.
    """
    if not isinstance(plan, _core.AttnPlan):
        raise argument_error("infinicp.torch.attention: plan must be an infinicp.AttnPlan, got %s"
                             % type(plan).__name__)
    descales = (q_descale, k_descale, v_descale)
    if plan.desc.dtype == _core._FP8:
        # no rank gets to a collective call: every rank of the plan refuses alike
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (q, k, v, sinks) + descales):
            raise _fp8_forward_only(plan, "infinicp.torch.attention")
    elif any(d is not None for d in descales):
        raise argument_error("infinicp.torch.attention: descales are for FP8 plans (dtype 'fp8_e4m3'); the plan's "
                             "dtype is %s" % plan.desc.dtype)
    return Attention.apply(q, k, v, sinks, plan, pack, descales)


def _positions(plan_or_layout, rank, seq_len, cp_size):
    """(positions of rank's tokens, cp_size) for a plan, pack or layout name."""
    if isinstance(plan_or_layout, _core.Pack):
        pk = plan_or_layout
        if pk.seq_len != seq_len:
            raise argument_error("the pack holds %d tokens, the tensor %d" % (pk.seq_len, seq_len))
        return pk.positions(rank), pk.cp_size
    if isinstance(plan_or_layout, _core.AttnPlan):
        plan = plan_or_layout
        if plan.desc.layout == "packed":
            raise argument_error("a packed plan's tokens are placed by its Pack: pass the Pack")
        if plan.desc.seq_len != seq_len:
            raise argument_error("the plan's seq_len is %d, the tensor has %d tokens" % (plan.desc.seq_len, seq_len))
        return _core.layout_positions(plan.desc.layout, plan.cp_size, rank, seq_len), plan.cp_size
    if cp_size is None:
        raise argument_error("a layout name needs cp_size=")
    return _core.layout_positions(plan_or_layout, cp_size, rank, seq_len), cp_size


def shard(x, plan_or_layout, rank, dim=1, cp_size=None):
    """CP rank ``rank``'s tokens of the whole-sequence tensor ``x`` along
    ``dim``, in the order the plan's forward takes them (differentiable:
    an ``index_select``).

    ``plan_or_layout``: an :class:`infinicp.AttnPlan` (contiguous or
    zigzag), a :class:`infinicp.Pack` (packed rows), or a layout name
    (``"contiguous"``, ``"zigzag"``) with ``cp_size=``. Works for inputs,
    labels, position ids: anything per token.
    """
    dim = dim % x.dim()
    pos, _ = _positions(plan_or_layout, rank, x.shape[dim], cp_size)
    return x.index_select(dim, torch.as_tensor(pos, device=x.device))


def gather(local, plan_or_layout, dim=1, cp_size=None, group=None):
    """The whole sequence from the ranks' shares along ``dim``.

    ``local`` a list of every rank's share (rank order): put together on
    this process, differentiable. ``local`` one tensor: this rank's share,
    gathered from all ranks through the library (collective over
    ``group``, or the plan's group; not differentiable).
    ``plan_or_layout`` as in :func:`shard`.
    """
    if isinstance(local, (list, tuple)):
        parts = list(local)
        p = len(parts)
        dim = dim % parts[0].dim()
        seq = sum(t.shape[dim] for t in parts)
        pos = []
        for r in range(p):
            pr, size = _positions(plan_or_layout, r, seq, p if cp_size is None else cp_size)
            if size != p:
                raise argument_error("gather: %d shares for a CP size of %d" % (p, size))
            pos.append(torch.as_tensor(pr))
        inv = torch.argsort(torch.cat(pos)).to(parts[0].device)
        return torch.cat(parts, dim).index_select(dim, inv)
    if group is None:
        if isinstance(plan_or_layout, _core.AttnPlan):
            group = plan_or_layout.group
        else:
            raise argument_error("gather: one share needs group= (or a plan) to gather from the other ranks")
    if isinstance(plan_or_layout, _core.AttnPlan):
        layout = plan_or_layout.desc.layout
        if layout == "packed":
            raise argument_error("gather: pass the Pack of a packed plan")
    else:
        layout = plan_or_layout
    t = local.detach().contiguous()
    if t.is_cuda:
        # order the gather after the work that made the share
        ctx = group.context
        s = torch.cuda.current_stream(t.device).cuda_stream
        if ctx.stream != (s or None):
            ctx.set_stream(s)
    return group.gather(t, layout, dim=dim)


def nccl_group(process_group=None, device=None, a2a_size=1, timeout_ms=300000):
    """An :class:`infinicp.Group` over the library's own NCCL communicator
    spanning ``process_group`` (a ``torch.distributed`` group; None = the
    default group), on ``device`` (a CUDA device; None = the current one).

    Collective over the process group: rank 0 makes an NCCL unique id
    (``cp_nccl_unique_id``), ``torch.distributed.broadcast_object_list``
    hands it to the others, and every rank creates its communicator from it
    (``cp_comm_create_nccl_id``) on a new CUDA context ordered on PyTorch's
    current stream. The group's ``context`` and ``comm`` are reachable as
    attributes and are released with it (``group.close()`` releases the
    group only; close ``group.comm`` and ``group.context`` too, or let the
    garbage collector do it).
    """
    import torch.distributed as dist

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        raise argument_error("nccl_group: device must be a CUDA device, got %s" % device)
    index = torch.cuda.current_device() if device.index is None else device.index
    device = torch.device("cuda", index)
    rank = dist.get_rank(process_group)
    size = dist.get_world_size(process_group)
    payload = None
    if rank == 0:
        try:
            payload = ("id", _core.nccl_unique_id())
        except Error as e:  # tell the others, so that they fail too instead of waiting
            payload = ("error", int(e.status), e.message)
    obj = [payload]
    if process_group is None:
        src = 0
    elif hasattr(dist, "get_global_rank"):
        src = dist.get_global_rank(process_group, 0)
    else:
        src = dist.distributed_c10d._get_global_rank(process_group, 0)
    try:
        dist.broadcast_object_list(obj, src=src, group=process_group, device=device)
    except TypeError:  # PyTorch before the device argument
        with torch.cuda.device(index):
            dist.broadcast_object_list(obj, src=src, group=process_group)
    payload = obj[0]
    if payload[0] != "id":
        status, message = payload[1], payload[2]
        raise Error(status, message if rank == 0 else "nccl_group: rank 0 could not make an NCCL id: " + message)
    ctx = _core.Context("cuda", index, stream=torch.cuda.current_stream(device).cuda_stream)
    try:
        comm = _core.Comm.from_nccl_id(ctx, payload[1], size, rank)
        try:
            return _core.Group(ctx, comm, a2a_size=a2a_size, timeout_ms=timeout_ms)
        except Error:
            comm.close()
            raise
    except Error:
        ctx.close()
        raise

