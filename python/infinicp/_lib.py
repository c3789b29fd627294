# SPDX-License-Identifier: MIT
"""Loading libinfinicp.so.1 and describing its C ABI to ctypes.

Private: the public names live in :mod:`infinicp`. Everything here follows
``include/infinicp/infinicp.h`` of API 1.1; the structures are the C ones
field for field (enums are ``int``), and every configuration structure is
passed with its ``struct_size`` set to the size ctypes computes, which is
the size the 1.1 header gives them.
"""

import ctypes
import ctypes.util
import enum
import os
import threading

__all__ = []

c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double
c_float = ctypes.c_float
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_unsigned = ctypes.c_uint
POINTER = ctypes.POINTER


# ---------------------------------------------------------------------------
# Status codes and the exception
# ---------------------------------------------------------------------------


class Status(enum.IntEnum):
    """The library's ``cp_status`` codes (values are fixed by the C ABI)."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    OUT_OF_MEMORY = 3
    BACKEND = 4
    COMM = 5
    TIMEOUT = 6
    MISMATCH = 7
    FORMAT = 8
    IO = 9
    NOT_FOUND = 10
    INTERNAL = 11


def _as_status(value):
    try:
        return Status(value)
    except ValueError:
        return int(value)


class Error(Exception):
    """A failed libinfinicp call.

    Attributes:
        status: the ``cp_status`` code, an ``int`` (a :class:`Status` member
            for the codes this package knows).
        message: the library's message (``cp_last_error()`` of the failing
            call, read on the same thread right after it), which names the
            function, the argument and its value; for checks this package
            makes before calling C, a message of the same form.

    ``str(error)`` is the message. Errors with status
    ``Status.INVALID_ARGUMENT`` are raised as :class:`ArgumentError`, which
    is also a ``ValueError`` and a ``TypeError``.
    """

    def __init__(self, status, message=""):
        self.status = _as_status(status)
        self.message = message or _status_string(int(status))
        super().__init__(self.message)

    @property
    def status_name(self):
        """The status as a name, e.g. ``"INVALID_ARGUMENT"``."""
        s = self.status
        return s.name if isinstance(s, Status) else "status %d" % s

    def __repr__(self):
        return "%s(%s, %r)" % (type(self).__name__, self.status_name, self.message)

    def __reduce__(self):
        return (_make_error, (int(self.status), self.message))


class ArgumentError(Error, ValueError, TypeError):
    """An :class:`Error` with status ``Status.INVALID_ARGUMENT``: an
    argument is missing, of the wrong type, shape, dtype or device, out of
    range or inconsistent. Also a ``ValueError`` and a ``TypeError``."""


def _make_error(status, message=""):
    cls = ArgumentError if int(status) == Status.INVALID_ARGUMENT else Error
    return cls(status, message)


def argument_error(message):
    """An :class:`ArgumentError` for a check made before calling C."""
    return ArgumentError(Status.INVALID_ARGUMENT, message)


def _status_string(status):
    try:
        return get().cp_status_string(status).decode("utf-8", "replace")
    except Exception:  # the library may not be loadable: still make an error
        return "status %d" % status


# ---------------------------------------------------------------------------
# Structures (infinicp.h, API 1.1)
# ---------------------------------------------------------------------------


class _Sized(ctypes.Structure):
    """A versioned configuration structure: struct_size is set on creation."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.struct_size = ctypes.sizeof(self)


class ContextConfig(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("device", c_int),
        ("device_index", c_int),
        ("stream", c_void_p),
        ("num_threads", c_int),
        ("deterministic", c_int),
    ]


class TopologyConfig(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("world_size", c_int),
        ("tp", c_int),
        ("cp", c_int),
        ("dp", c_int),
        ("pp", c_int),
        ("cp_a2a", c_int),
        ("order", c_char_p),
    ]


class Coords(ctypes.Structure):
    _fields_ = [(n, c_int) for n in ("tp", "cp", "dp", "pp", "cp_a2a", "cp_p2p")]


class GroupConfig(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("a2a_size", c_int),
        ("timeout_ms", c_int),
        ("num_streams", c_int),
    ]


class AttnDescC(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("dtype", c_int),
        ("format", c_int),
        ("batch", c_int64),
        ("seq_len", c_int64),
        ("num_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("head_dim_v", c_int32),
        ("mask", c_int),
        ("softmax_scale", c_double),
        ("layout", c_int),
        ("mode", c_int),
        ("window", c_int64),
        ("softcap", c_double),
        ("sinks", c_int),
    ]


class PackConfig(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("cp_size", c_int),
        ("cu_seqlens", POINTER(c_int64)),
        ("num_seqs", c_int),
        ("mask", c_int),
        ("window", c_int64),
        ("balance", c_int),
        ("chunk", c_int64),
    ]


class AttnArgs(_Sized):
    _fields_ = [
        ("struct_size", c_size_t),
        ("pack", c_void_p),
        ("sinks", c_void_p),
        ("dsinks", c_void_p),
        ("workspace", c_void_p),
        ("workspace_bytes", c_size_t),
        # API 1.2 (a 1.1 library reads only as far as its own struct)
        ("q_descale", c_void_p),
        ("k_descale", c_void_p),
        ("v_descale", c_void_p),
        ("descale_per_head", c_int),
    ]


class AttnRect(ctypes.Structure):
    _fields_ = [(n, c_int64) for n in ("q_row", "q_len", "k_row", "k_len", "q_pos", "k_pos")]


def _tensor_fields(name):
    return [(name, c_void_p)] + [("%s_stride_%s" % (name, d), c_int64) for d in "bsh"]


class KernelAttnArgs(_Sized):
    _fields_ = (
        [
            ("struct_size", c_size_t),
            ("dtype", c_int),
            ("format", c_int),
            ("batch", c_int64),
            ("num_heads", c_int32),
            ("num_kv_heads", c_int32),
            ("head_dim", c_int32),
            ("head_dim_v", c_int32),
            ("seq_q", c_int64),
            ("seq_k", c_int64),
            ("q_offset", c_int64),
            ("k_offset", c_int64),
            ("mask", c_int),
            ("softmax_scale", c_double),
        ]
        + _tensor_fields("q")
        + _tensor_fields("k")
        + _tensor_fields("v")
        + _tensor_fields("o")
        + [
            ("o_dtype", c_int),
            ("lse", c_void_p),
            ("lse_stride_b", c_int64),
            ("lse_stride_h", c_int64),
            ("accumulate", c_int),
        ]
        + _tensor_fields("dout")
        + _tensor_fields("dq")
        + _tensor_fields("dk")
        + _tensor_fields("dv")
        + [
            ("grad_dtype", c_int),
            ("grad_accumulate", c_int),
            ("workspace", c_void_p),
            ("workspace_bytes", c_size_t),
            ("lse_lo", c_void_p),
            ("drow", c_void_p),
            ("drow_ready", c_int),
            ("window", c_int64),
            ("softcap", c_double),
            ("rects", c_void_p),
            ("num_rects", c_int64),
            ("q_descale", c_void_p),
            ("k_descale", c_void_p),
            ("v_descale", c_void_p),
            ("descale_per_head", c_int),
        ]
    )


class KernelMergeArgs(_Sized):
    _fields_ = (
        [
            ("struct_size", c_size_t),
            ("format", c_int),
            ("batch", c_int64),
            ("seq", c_int64),
            ("num_heads", c_int32),
            ("head_dim_v", c_int32),
        ]
        + _tensor_fields("o")
        + [
            ("o_dtype", c_int),
            ("lse", c_void_p),
            ("lse_stride_b", c_int64),
            ("lse_stride_h", c_int64),
        ]
        + _tensor_fields("o_part")
        + [
            ("o_part_dtype", c_int),
            ("lse_part", c_void_p),
            ("lse_part_stride_b", c_int64),
            ("lse_part_stride_h", c_int64),
        ]
    )


# ---------------------------------------------------------------------------
# Prototypes
# ---------------------------------------------------------------------------

P = c_void_p  # every handle crosses as an opaque pointer
PP = POINTER(c_void_p)
I64P = POINTER(c_int64)

_PROTOTYPES = {
    # status and version
    "cp_status_string": (c_char_p, [c_int]),
    "cp_last_error": (c_char_p, []),
    "cp_version": (c_unsigned, []),
    # context
    "cp_context_create": (c_int, [POINTER(ContextConfig), PP]),
    "cp_context_set_stream": (c_int, [P, c_void_p]),
    "cp_context_synchronize": (c_int, [P]),
    "cp_context_destroy": (None, [P]),
    # topology
    "cp_topology_create": (c_int, [POINTER(TopologyConfig), PP]),
    "cp_topology_coords": (c_int, [P, c_int, POINTER(Coords)]),
    "cp_topology_rank": (c_int, [P, POINTER(Coords), POINTER(c_int)]),
    "cp_topology_group": (c_int, [P, c_int, c_unsigned, POINTER(c_int), c_int, POINTER(c_int), POINTER(c_int)]),
    "cp_topology_color": (c_int, [P, c_int, c_unsigned, POINTER(c_int), POINTER(c_int)]),
    "cp_topology_destroy": (None, [P]),
    # layouts
    "cp_layout_positions": (c_int, [c_int, c_int, c_int, c_int64, I64P]),
    "cp_layout_shard": (c_int, [P, c_int, c_int, c_int, c_void_p, c_void_p, c_int64, c_int64, c_size_t]),
    "cp_layout_gather": (c_int, [P, c_int, c_void_p, c_void_p, c_int64, c_int64, c_size_t]),
    # communicators
    "cp_comm_create_local": (c_int, [c_int, PP]),
    "cp_comm_create_mpi": (c_int, [c_void_p, PP]),
    "cp_comm_split": (c_int, [P, c_int, c_int, PP]),
    "cp_comm_rank": (c_int, [P, POINTER(c_int)]),
    "cp_comm_size": (c_int, [P, POINTER(c_int)]),
    "cp_comm_destroy": (None, [P]),
    "cp_comm_create_nccl": (c_int, [c_void_p, PP]),
    # groups
    "cp_group_create": (c_int, [P, P, POINTER(GroupConfig), PP]),
    "cp_group_rank": (c_int, [P, POINTER(c_int)]),
    "cp_group_size": (c_int, [P, POINTER(c_int)]),
    "cp_group_destroy": (None, [P]),
    # attention
    "cp_attn_plan_create": (c_int, [P, POINTER(AttnDescC), PP]),
    "cp_attn_workspace_size": (c_int, [P, POINTER(c_size_t), POINTER(c_size_t)]),
    "cp_attn_forward": (c_int, [P, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t]),
    "cp_attn_backward": (
        c_int,
        [P, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t],
    ),
    "cp_attn_plan_destroy": (None, [P]),
    # packed documents (1.1)
    "cp_pack_create": (c_int, [POINTER(PackConfig), PP]),
    "cp_pack_positions": (c_int, [P, c_int, c_void_p, c_void_p, c_void_p]),
    "cp_pack_work": (c_int, [P, c_int, POINTER(c_double)]),
    "cp_pack_shard": (c_int, [P, P, c_int, c_void_p, c_void_p, c_size_t]),
    "cp_pack_gather": (c_int, [P, P, c_void_p, c_void_p, c_size_t]),
    "cp_pack_destroy": (None, [P]),
    "cp_attn_forward_ex": (c_int, [P, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, POINTER(AttnArgs)]),
    "cp_attn_backward_ex": (
        c_int,
        [P, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, POINTER(AttnArgs)],
    ),
    # single-device kernels
    "cp_kernel_attn_forward": (c_int, [P, POINTER(KernelAttnArgs)]),
    "cp_kernel_attn_backward": (c_int, [P, POINTER(KernelAttnArgs)]),
    "cp_kernel_attn_workspace_size": (c_int, [P, POINTER(KernelAttnArgs), c_int, POINTER(c_size_t)]),
    "cp_kernel_merge": (c_int, [P, POINTER(KernelMergeArgs)]),
    # training helpers
    "cp_loss_reduce": (c_int, [P, P, c_double, c_int64, POINTER(c_double), I64P]),
    "cp_grad_all_reduce": (c_int, [P, P, c_void_p, c_size_t, c_int, c_int, c_size_t]),
    "cp_seq_local_len": (c_int, [P, POINTER(AttnDescC), I64P]),
    "cp_stage_shape": (c_int, [P, POINTER(AttnDescC), c_int64, c_unsigned, I64P, POINTER(c_size_t)]),
    # checkpoint metadata
    "cp_ckpt_meta_create": (c_int, [P, POINTER(AttnDescC), PP]),
    "cp_ckpt_meta_save": (c_int, [P, c_char_p]),
    "cp_ckpt_meta_load": (c_int, [c_char_p, PP]),
    "cp_ckpt_meta_to_json": (c_int, [P, c_char_p, c_size_t, POINTER(c_size_t)]),
    "cp_ckpt_meta_from_json": (c_int, [c_char_p, c_size_t, PP]),
    "cp_ckpt_meta_get": (c_int, [P, c_char_p, I64P]),
    "cp_ckpt_meta_check": (c_int, [P, P, POINTER(c_int), c_char_p, c_size_t]),
    "cp_ckpt_is_writer": (c_int, [P, c_int, c_int, POINTER(c_int)]),
    "cp_ckpt_meta_destroy": (None, [P]),
}

# Calls that may be missing from the library the package runs against: bound
# on first use, so that the package works without them (they came after 1.1.0
# in some builds).
_OPTIONAL = {
    "cp_nccl_unique_id": (c_int, [c_void_p, c_size_t]),
    "cp_comm_create_nccl_id": (c_int, [P, c_void_p, c_size_t, c_int, c_int, PP]),
}

# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("INFINICP_LIBRARY")
    if env:
        return [env], True
    names = []
    found = ctypes.util.find_library("infinicp")
    if found:
        names.append(found)
    names.append("libinfinicp.so.1")
    return names, False


def _load():
    names, from_env = _candidates()
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)  # CDLL: the GIL is released during every call
        except OSError as e:
            errors.append("%s: %s" % (name, e))
            continue
        for fname, (restype, argtypes) in _PROTOTYPES.items():
            try:
                f = getattr(lib, fname)
            except AttributeError:
                errors.append("%s: has no %s (libinfinicp 1.1 or newer is needed)" % (name, fname))
                lib = None
                break
            f.restype = restype
            f.argtypes = argtypes
        if lib is None:
            continue
        return lib, name
    where = "INFINICP_LIBRARY=%s" % names[0] if from_env else "the system's library path"
    raise ImportError("infinicp: cannot load libinfinicp.so.1 from %s (%s); install libinfinicp1 or set "
                      "INFINICP_LIBRARY to the library's path" % (where, "; ".join(errors)))


def get():
    """The loaded library (a ctypes.CDLL), loaded on first use."""
    global _lib, _path
    lib = _lib
    if lib is not None:
        return lib
    with _lock:
        if _lib is None:
            _lib, _path = _load()
        return _lib


def path():
    """The name or path the library was loaded from."""
    get()
    return _path


def optional(name):
    """An optional C function, or None when the loaded library lacks it."""
    lib = get()
    if not hasattr(lib, name):
        return None
    f = getattr(lib, name)
    restype, argtypes = _OPTIONAL[name]
    f.restype = restype
    f.argtypes = argtypes
    return f


def last_error():
    """The calling thread's last message from the library."""
    return get().cp_last_error().decode("utf-8", "replace")


def check(status):
    """Raise the library's error for a non-zero status (call right after the
    failing C call, on the same thread, so that the message is its own)."""
    if status != 0:
        raise _make_error(status, last_error())
