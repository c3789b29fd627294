# SPDX-License-Identifier: MIT
"""infinicp: context-parallel (CP) attention from Python.

A pure-Python package over the C ABI of libinfinicp.so.1 (ctypes; no
extension module), so that one package serves every Python 3 and every
PyTorch version. The library is looked up in ``$INFINICP_LIBRARY`` (a
path) first, then as the system's ``libinfinicp.so.1``, on first use.

Quick start, two in-process ranks on the CPU::

    import numpy as np, infinicp

    def rank_main(rank, comm):
        with infinicp.Context("cpu", num_threads=1) as ctx, \\
             infinicp.Group(ctx, comm) as group, \\
             infinicp.AttnPlan(group, "float32", batch=1, seq_len=64, num_heads=4,
                               num_kv_heads=4, head_dim=16, layout="zigzag") as plan:
            q = np.random.rand(*plan.q_shape).astype(np.float32)
            out, lse = plan.forward(q, q, q)
            return out

    outs = infinicp.run_ranks(2, rank_main)

Every failing call raises :class:`Error`, whose ``status`` is the C
library's ``cp_status`` and whose message is the library's (naming the
argument); arguments the package rejects before calling C raise
:class:`ArgumentError` (an ``Error`` with ``Status.INVALID_ARGUMENT``, also
a ``ValueError`` and ``TypeError``).

Arrays: NumPy arrays on the CPU (float32, float16; for bfloat16 ``uint16``
arrays holding bf16 bits, or ``ml_dtypes.bfloat16`` arrays when that
module is used: outputs follow the inputs; see :func:`float32_to_bf16_bits`
and :func:`bf16_bits_to_float32`; FP8 E4M3 plans, API 1.2, take
``uint8`` arrays of the codes, see :func:`float32_to_fp8_e4m3_bits` and
:func:`fp8_e4m3_bits_to_float32`, or ``ml_dtypes.float8_e4m3fn`` arrays,
and PyTorch's ``torch.float8_e4m3fn``); on CUDA, PyTorch tensors, CuPy arrays
(bfloat16 as ``uint16`` bits, as CuPy has no bfloat16) and other objects
with ``__cuda_array_interface__`` or DLPack. Outputs are allocated like the
inputs, on their device: a NumPy input gives NumPy outputs, a PyTorch one
PyTorch outputs, a CuPy one CuPy outputs; any other CUDA array gives CuPy
arrays when CuPy can be imported, else PyTorch tensors. An array on
another device than the context's raises :class:`ArgumentError` naming
it. CUDA work is ordered on the context's stream (``Context(stream=)``):
DLPack producers are handed that stream; arrays made on other streams must
be ready (synchronised) before the call.

Objects own C handles: ``close()`` them (or use ``with``) to release them
at a known point; the garbage collector releases them otherwise. Closing an
object first closes what was made from it (a group's plans; a context's or
a communicator's groups), so the library's destruction order always holds.

``infinicp.torch`` (an attribute or ``import infinicp.torch``) is the
PyTorch layer; it needs PyTorch, which ``import infinicp`` does not.
"""

from ._arrays import bf16_bits_to_float32, float32_to_bf16_bits, float32_to_fp8_e4m3_bits, fp8_e4m3_bits_to_float32
from ._core import (
    AttnDesc,
    AttnPlan,
    CheckResult,
    CkptMeta,
    Comm,
    Context,
    Coords,
    Group,
    Pack,
    Topology,
    Verdict,
    have_nccl_id,
    kernel_attention_backward,
    kernel_attention_forward,
    kernel_merge,
    layout_positions,
    layout_shard,
    library_path,
    live_handles,
    local_world,
    nccl_unique_id,
    run_ranks,
    status_string,
    version,
    version_info,
)
from ._lib import ArgumentError, Error, Status

__version__ = "1.2.0"

#: ``CP_AXIS_*`` bits, for Topology.group() and Topology.color() (names work too).
AXIS_TP, AXIS_CP, AXIS_DP, AXIS_PP, AXIS_CP_A2A, AXIS_CP_P2P = 1, 2, 4, 8, 16, 32

__all__ = [
    "AXIS_CP",
    "AXIS_CP_A2A",
    "AXIS_CP_P2P",
    "AXIS_DP",
    "AXIS_PP",
    "AXIS_TP",
    "ArgumentError",
    "AttnDesc",
    "AttnPlan",
    "CheckResult",
    "CkptMeta",
    "Comm",
    "Context",
    "Coords",
    "Error",
    "Group",
    "Pack",
    "Status",
    "Topology",
    "Verdict",
    "bf16_bits_to_float32",
    "float32_to_bf16_bits",
    "float32_to_fp8_e4m3_bits",
    "fp8_e4m3_bits_to_float32",
    "have_nccl_id",
    "kernel_attention_backward",
    "kernel_attention_forward",
    "kernel_merge",
    "layout_positions",
    "layout_shard",
    "library_path",
    "live_handles",
    "local_world",
    "nccl_unique_id",
    "run_ranks",
    "status_string",
    "version",
    "version_info",
]


def __getattr__(name):
    # infinicp.torch on first use, only when PyTorch is importable
    if name == "torch":
        import importlib

        try:
            return importlib.import_module(".torch", __name__)
        except ImportError as e:
            raise AttributeError("infinicp.torch needs PyTorch (%s)" % e) from e
    raise AttributeError("module 'infinicp' has no attribute %r" % name)
