# SPDX-License-Identifier: MIT
"""The Python form of libinfinicp's public API. Private: import from
:mod:`infinicp`."""

import collections
import ctypes
import enum
import os
import operator
import threading

import numpy as np

from . import _arrays
from . import _lib
from ._lib import Error, Status, argument_error, check

__all__ = []

byref = ctypes.byref

# ---------------------------------------------------------------------------
# Names <-> enum values
# ---------------------------------------------------------------------------

_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "float8_e4m3fn": 4}
_DTYPE_ALIASES = {
    "float32": "float32", "f32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "f16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "f64": "float64", "fp64": "float64", "double": "float64",
    # API 1.2: OCP FP8 E4M3 (PyTorch's torch.float8_e4m3fn), forward only
    "float8_e4m3fn": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn",
    "float8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "f8e4m3": "float8_e4m3fn",
}
_FP8 = "float8_e4m3fn"
_DEVICES = {"cpu": 0, "cuda": 1}
_LAYOUTS = {"contiguous": 0, "zigzag": 1, "packed": 2}
_MODES = {"all_gather": 0, "p2p": 1, "a2a": 2, "a2a_p2p": 3}
_FORMATS = {"bshd": 0, "sbhd": 1}
_BALANCES = {"auto": 0, "doc_zigzag": 1, "greedy": 2, "contiguous": 3}
_AXES = {"tp": 1, "cp": 2, "dp": 4, "pp": 8, "cp_a2a": 16, "cp_p2p": 32}
_ROLES = {"replicated": 0, "sharded": 1}
_GRAD_OPS = {"sum": 0, "average": 1}


def _choice(value, table, what):
    """The enum value of a name (or of an int already in the table)."""
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
        if key in table:
            return table[key]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in table.values():
        return int(value)
    raise argument_error("%s = %r: expected one of %s" % (what, value, ", ".join(repr(k) for k in table)))


def _dtype_name(value, what="dtype"):
    """A canonical element type name from a string, NumPy or PyTorch dtype."""
    if isinstance(value, str):
        key = value.lower()
        if key.startswith("torch."):
            key = key[len("torch."):]
    elif type(value).__module__.split(".")[0] == "torch":
        key = str(value).replace("torch.", "")
    else:
        try:
            key = np.dtype(value).name
        except TypeError:
            key = None
    if key in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[key]
    raise argument_error("%s = %r: expected 'float32', 'float16', 'bfloat16' or 'fp8_e4m3'" % (what, value))


def _int(value, what):
    if isinstance(value, bool):
        raise argument_error("%s = %r: expected an integer" % (what, value))
    try:
        return operator.index(value)
    except TypeError:
        raise argument_error("%s = %r: expected an integer" % (what, value)) from None


def _float(value, what):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise argument_error("%s = %r: expected a number" % (what, value)) from None


def _name_of(table, value):
    for k, v in table.items():
        if v == value:
            return k
    return value


# ---------------------------------------------------------------------------
# Handles: deterministic release in dependency order
# ---------------------------------------------------------------------------

_lock = threading.RLock()  # re-entrant: a collector run inside a locked section may close handles
_live = collections.Counter()
_tls = threading.local()


class _Res:
    """One C handle and the handles that must be destroyed before it.

    The wrappers (Context, Group, ...) hold one each; a parent's ``_Res``
    holds its children's ``_Res`` (not the wrappers), so that closing a
    parent, explicitly or from the garbage collector in any order, first
    destroys every child still open."""

    __slots__ = ("h", "destroy", "kind", "children", "parents")

    def __init__(self, kind, destroy, parents=()):
        self.h = None
        self.kind = kind
        self.destroy = destroy
        self.children = set()
        self.parents = [p for p in parents if p is not None]

    def attach(self, handle):
        with _lock:
            self.h = handle
            _live[self.kind] += 1
            for p in self.parents:
                p.children.add(self)
        collector = getattr(_tls, "collector", None)
        if collector is not None:
            collector.append(self)

    def close(self):
        with _lock:
            h, self.h = self.h, None
            kids = list(self.children)
            self.children.clear()
            parents, self.parents = self.parents, []
            for p in parents:
                p.children.discard(self)
        for k in kids:
            k.close()
        if h:
            if self.destroy is not None:
                self.destroy(h)
            with _lock:
                _live[self.kind] -= 1


def live_handles():
    """How many C objects of each kind this process has open through the
    package, e.g. ``{"context": 2, "group": 2, "plan": 2, ...}``: for leak
    checks."""
    with _lock:
        return {k: v for k, v in _live.items() if v}


class _Handle:
    """Base of every wrapper of a C handle: ``close()``, context manager,
    release in ``__del__`` as a fallback."""

    _kind = None
    _destroy = None

    def _init_res(self, parents=()):
        lib = _lib.get()
        self._res = _Res(self._kind, getattr(lib, self._destroy) if self._destroy else None,
                         [p._res for p in parents if p is not None])

    @property
    def _h(self):
        res = self.__dict__.get("_res")
        h = res.h if res is not None else None
        if not h:
            raise argument_error("%s: the object is closed" % type(self).__name__)
        return h

    @property
    def closed(self):
        """True once the C object is released."""
        res = self.__dict__.get("_res")
        return res is None or not res.h

    def close(self):
        """Release the C object now, and first every object made from it
        that is still open (plans of a group, groups of a context or
        communicator). Idempotent."""
        res = self.__dict__.get("_res")
        if res is not None:
            res.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


# ---------------------------------------------------------------------------
# Version, status
# ---------------------------------------------------------------------------


def version():
    """The loaded library's version as a string, e.g. ``"1.1.0"``."""
    return "%d.%d.%d" % version_info()


def version_info():
    """The loaded library's version as a tuple ``(major, minor, patch)``."""
    v = _lib.get().cp_version()
    return (v // 10000, v // 100 % 100, v % 100)


def status_string(status):
    """The library's short description of a status code."""
    return _lib.get().cp_status_string(int(status)).decode("utf-8", "replace")


def library_path():
    """The name or path libinfinicp was loaded from (``INFINICP_LIBRARY``
    when set, else the system's ``libinfinicp.so.1``)."""
    return _lib.path()


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------


def _stream_ptr(stream, what="stream"):
    if stream is None:
        return None
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream) or None
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, cuda-python
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v or None
    raise argument_error("%s = %r: expected None, a cudaStream_t as an int, or a stream object "
                         "(torch.cuda.Stream, cupy.cuda.Stream)" % (what, stream))


def _device(device, device_index):
    if not isinstance(device, str) and type(device).__module__.split(".")[0] == "torch":  # torch.device
        device = str(device)
    if isinstance(device, str) and ":" in device:
        device, _, idx = device.partition(":")
        try:
            device_index = int(idx)
        except ValueError:
            raise argument_error("device = %r: expected 'cpu', 'cuda' or 'cuda:N'" % (device + ":" + idx)) from None
    return _choice(device, _DEVICES, "device"), _int(device_index, "device_index")


class Context(_Handle):
    """A device (and, on CUDA, a stream) the library's work runs on
    (``cp_context_create``).

    Args:
        device: ``"cpu"`` or ``"cuda"`` (also ``"cuda:N"`` or a
            ``torch.device``).
        device_index: the device ordinal; 0 for the CPU.
        stream: CUDA only: the stream work is ordered on, as an int
            (``cudaStream_t``) or a ``torch.cuda.Stream`` / CuPy stream;
            None = the default stream.
        num_threads: CPU worker threads; 0 = one per processor.
        deterministic: bitwise reproducible backward results.

    A context is used by one thread at a time: give each rank its own.
    """

    _kind = "context"
    _destroy = "cp_context_destroy"

    def __init__(self, device="cpu", device_index=0, stream=None, num_threads=0, deterministic=False):
        dev, index = _device(device, device_index)
        cfg = _lib.ContextConfig(device=dev, device_index=index, stream=_stream_ptr(stream),
                                 num_threads=_int(num_threads, "num_threads"),
                                 deterministic=int(deterministic) if isinstance(deterministic, bool)
                                 else _int(deterministic, "deterministic"))
        self._init_res()
        h = ctypes.c_void_p()
        check(_lib.get().cp_context_create(byref(cfg), byref(h)))
        self._res.attach(h.value)
        self.device = _name_of(_DEVICES, dev)
        self.device_index = index
        self.num_threads = cfg.num_threads
        self.deterministic = bool(cfg.deterministic)
        self._stream = cfg.stream

    def __repr__(self):
        return "Context(device=%r, device_index=%d%s)" % (self.device, self.device_index,
                                                          ", closed" if self.closed else "")

    @property
    def stream(self):
        """The stream work is ordered on (an int), or None for the default."""
        return self._stream

    def set_stream(self, stream):
        """Order later work on ``stream`` (``cp_context_set_stream``); None =
        the default stream. CPU contexts take None only."""
        ptr = _stream_ptr(stream)
        check(_lib.get().cp_context_set_stream(self._h, ptr))
        self._stream = ptr

    def synchronize(self):
        """Wait for the work queued on the context's stream."""
        check(_lib.get().cp_context_synchronize(self._h))


def _default_context():
    """This thread's own CPU context (one worker thread), for host-side
    helpers that need a context."""
    ctx = getattr(_tls, "cpu_context", None)
    if ctx is None or ctx.closed:
        collector = getattr(_tls, "collector", None)
        _tls.collector = None  # not one of a rank's objects: run_ranks leaves it
        try:
            ctx = Context("cpu", num_threads=1)
        finally:
            _tls.collector = collector
        _tls.cpu_context = ctx
    return ctx


def _context_for(ref, ctx, what):
    if ctx is not None:
        if not isinstance(ctx, Context):
            raise argument_error("%s: ctx must be a Context, got %s" % (what, type(ctx).__name__))
        return ctx
    if ref.device != "cpu":
        raise argument_error("%s: a %s array needs ctx=, a Context of its device" % (what, ref.device))
    return _default_context()


# ---------------------------------------------------------------------------
# Communicators
# ---------------------------------------------------------------------------


class Comm(_Handle):
    """One rank's handle on a communicator (``cp_comm``).

    Made by :func:`local_world`, :meth:`split`, :meth:`from_mpi`,
    :meth:`from_nccl` or :meth:`from_nccl_id`. Collective calls (split,
    Group, AttnPlan and its forward/backward, loss and gradient reductions)
    block until every rank has made them: drive each rank from its own
    thread (calls release the GIL), see :func:`run_ranks`.
    """

    _kind = "comm"
    _destroy = "cp_comm_destroy"

    def __init__(self, *a, **kw):
        raise TypeError("Comm objects are made by infinicp.local_world(), Comm.split(), Comm.from_mpi(), "
                        "Comm.from_nccl() or Comm.from_nccl_id()")

    @classmethod
    def _wrap(cls, handle, parents=()):
        self = object.__new__(cls)
        self._init_res(parents)
        self._res.attach(handle)
        lib = _lib.get()
        r, n = ctypes.c_int(), ctypes.c_int()
        check(lib.cp_comm_rank(handle, byref(r)))
        check(lib.cp_comm_size(handle, byref(n)))
        self.rank = r.value
        self.size = n.value
        return self

    def __repr__(self):
        return "Comm(rank=%d, size=%d%s)" % (self.rank, self.size, ", closed" if self.closed else "")

    def split(self, color, key=None):
        """Split the communicator (collective): ranks passing the same
        non-negative ``color`` form a new one, ordered by (``key``, old
        rank); ``key`` None = this rank. A negative color joins none and
        returns None."""
        out = ctypes.c_void_p()
        check(_lib.get().cp_comm_split(self._h, _int(color, "color"),
                                       self.rank if key is None else _int(key, "key"), byref(out)))
        return Comm._wrap(out.value) if out.value else None

    @classmethod
    def from_mpi(cls, mpi_comm):
        """Wrap an MPI communicator (collective; ``cp_comm_create_mpi``):
        an ``mpi4py.MPI.Comm`` or the address of an ``MPI_Comm`` as an
        int. Needs the library's MPI transport module."""
        if isinstance(mpi_comm, int):
            addr = mpi_comm
        else:
            try:
                from mpi4py import MPI
            except ImportError:
                raise argument_error("Comm.from_mpi: pass an mpi4py communicator or the address of an "
                                     "MPI_Comm") from None
            addr = MPI._addressof(mpi_comm)
        out = ctypes.c_void_p()
        check(_lib.get().cp_comm_create_mpi(addr, byref(out)))
        return cls._wrap(out.value)

    @classmethod
    def from_nccl(cls, nccl_comm):
        """Wrap an initialised ``ncclComm_t`` (given as an int; not owned:
        it must outlive the result; ``cp_comm_create_nccl``)."""
        out = ctypes.c_void_p()
        check(_lib.get().cp_comm_create_nccl(_int(nccl_comm, "nccl_comm") or None, byref(out)))
        return cls._wrap(out.value)

    @classmethod
    def from_nccl_id(cls, ctx, unique_id, nranks, rank):
        """Create a library-owned NCCL communicator of ``nranks`` ranks from
        an NCCL unique id (128 bytes from :func:`nccl_unique_id` on one
        rank, handed to the others by any means), on ``ctx``'s CUDA device
        (``cp_comm_create_nccl_id``; collective over the ``nranks``
        ranks). The communicator is released before ``ctx``."""
        f = _lib.optional("cp_comm_create_nccl_id")
        if f is None:
            raise Error(Status.UNSUPPORTED, "Comm.from_nccl_id: %s has no cp_comm_create_nccl_id (a newer "
                        "libinfinicp is needed)" % _lib.path())
        if not isinstance(ctx, Context):
            raise argument_error("Comm.from_nccl_id: ctx must be a Context, got %s" % type(ctx).__name__)
        uid = bytes(unique_id)
        out = ctypes.c_void_p()
        check(f(ctx._h, uid, len(uid), _int(nranks, "nranks"), _int(rank, "rank"), byref(out)))
        return cls._wrap(out.value, parents=(ctx,))

    def loss_reduce(self, loss_sum, tokens, ctx=None):
        """The global mean loss from this rank's (summed loss, token count)
        (collective; ``cp_loss_reduce``): returns ``(mean, total_tokens)``.
        ``ctx`` None = host memory."""
        mean, total = ctypes.c_double(), ctypes.c_int64()
        check(_lib.get().cp_loss_reduce(ctx._h if ctx is not None else None, self._h,
                                        _float(loss_sum, "loss_sum"), _int(tokens, "tokens"), byref(mean),
                                        byref(total)))
        return mean.value, total.value

    def grad_all_reduce(self, grad, op="sum", bucket_bytes=0, ctx=None, dtype=None):
        """Sum (``op="sum"``) or average (``"average"``) a gradient buffer
        over the communicator, in place (collective;
        ``cp_grad_all_reduce``). ``grad`` is a contiguous float32, float16,
        bfloat16 or float64 array; a ``uint16`` NumPy array of bf16 bits
        needs ``dtype="bfloat16"``. ``ctx`` None = host memory (a CPU
        array)."""
        ref = _arrays.view(grad, "grad_all_reduce: grad")
        name = ref.dtype if dtype is None else _dtype_name(dtype)
        if ref.dtype == "uint16" and name == "bfloat16":
            pass
        elif name != ref.dtype or name not in _DTYPES:
            raise argument_error("grad_all_reduce: grad has dtype %s%s" % (
                ref.dtype, "" if dtype is None else ", not %s" % name))
        if not ref.contiguous or not ref.writeable:
            raise argument_error("grad_all_reduce: grad must be contiguous and writeable")
        if ref.device != "cpu" and ctx is None:
            raise argument_error("grad_all_reduce: a %s array needs ctx=" % ref.device)
        check(_lib.get().cp_grad_all_reduce(ctx._h if ctx is not None else None, self._h, ref.ptr or None,
                                            ref.size, _DTYPES[name], _choice(op, _GRAD_OPS, "op"),
                                            _int(bucket_bytes, "bucket_bytes")))
        return grad


def local_world(n):
    """An in-process world of ``n`` ranks (``cp_comm_create_local``): a list
    of ``n`` :class:`Comm`, element i being rank i. Drive each from its own
    thread (see :func:`run_ranks`)."""
    n = _int(n, "n")
    arr = (ctypes.c_void_p * max(n, 1))()
    check(_lib.get().cp_comm_create_local(n, arr))
    return [Comm._wrap(arr[i]) for i in range(n)]


def nccl_unique_id():
    """A new NCCL unique id: 128 opaque bytes (``cp_nccl_unique_id``), made
    on one rank and handed to the others for :meth:`Comm.from_nccl_id`.
    Needs the CUDA module with NCCL."""
    f = _lib.optional("cp_nccl_unique_id")
    if f is None:
        raise Error(Status.UNSUPPORTED, "nccl_unique_id: %s has no cp_nccl_unique_id (a newer libinfinicp is "
                    "needed)" % _lib.path())
    buf = ctypes.create_string_buffer(128)
    check(f(buf, 128))
    return buf.raw


def have_nccl_id():
    """Whether the loaded library has the NCCL unique-id calls
    (:func:`nccl_unique_id`, :meth:`Comm.from_nccl_id`)."""
    return _lib.optional("cp_nccl_unique_id") is not None and _lib.optional("cp_comm_create_nccl_id") is not None


# ---------------------------------------------------------------------------
# Running ranks on threads
# ---------------------------------------------------------------------------


def run_ranks(world, fn, *args, **kwargs):
    """Run ``fn(rank, comm, *args, **kwargs)`` for every rank of an
    in-process world, each on its own thread, and return the results in
    rank order.

    ``world`` is a number of ranks (a new :func:`local_world`, closed
    afterwards) or a list of :class:`Comm`. If a rank raises, the C
    objects that rank's thread made are released at once (so that peers
    waiting for it in a collective fail instead of waiting for the
    timeout), and once every thread has ended the first exception is
    re-raised: the first that is not a ``Status.MISMATCH`` or
    ``Status.COMM`` error (the echo of another rank's failure) if there is
    one.
    """
    own = not isinstance(world, (list, tuple))
    comms = local_world(world) if own else list(world)
    results = [None] * len(comms)
    failures = []

    def main(i):
        made = []
        _tls.collector = made
        try:
            results[i] = fn(i, comms[i], *args, **kwargs)
        except BaseException as e:  # noqa: B902 - re-raised by the caller
            with _lock:
                failures.append((i, e))
            for res in reversed(made):
                res.close()
            if own:
                comms[i].close()
        finally:
            _tls.collector = None

    threads = [threading.Thread(target=main, args=(i,), name="infinicp-rank-%d" % i) for i in range(len(comms))]
    try:
        for t in threads:
            t.start()
    finally:
        for t in threads:
            if t.ident is not None:
                t.join()
        if own:
            for c in comms:
                c.close()
    if failures:
        def echo(e):
            return isinstance(e, Error) and e.status in (Status.MISMATCH, Status.COMM)
        root = [f for f in failures if not echo(f[1])] or failures
        raise root[0][1]
    return results


# ---------------------------------------------------------------------------
# Topology
# ---------------------------------------------------------------------------

Coords = collections.namedtuple("Coords", ["tp", "cp", "dp", "pp", "cp_a2a", "cp_p2p"])
Coords.__doc__ = "A rank's coordinates along each axis (cp = cp_a2a + cp_p2p * cp_a2a size)."


def _axes(axes):
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        return int(axes)
    if isinstance(axes, str):
        names = [a for a in axes.replace(",", " ").replace("|", " ").replace("+", " ").split() if a]
    else:
        try:
            names = list(axes)
        except TypeError:
            raise argument_error("axes = %r: expected axis names ('tp', 'cp', 'dp', 'pp', 'cp_a2a', 'cp_p2p') "
                                 "or CP_AXIS_* bits" % (axes,)) from None
    bits = 0
    for a in names:
        bits |= _choice(a, _AXES, "axis")
    return bits


class Topology(_Handle):
    """The arithmetic between ranks and their (tp, cp, dp, pp, cp_a2a,
    cp_p2p) coordinates (``cp_topology_create``); no communication.

    Args:
        world_size: ranks in the world.
        tp, cp, pp: tensor-, context- and pipeline-parallel sizes.
        dp: data-parallel size; 0 = world_size / (tp * cp * pp).
        cp_a2a: the a2a part of cp (consecutive cp ranks).
        order: the axis order, fastest first; None = ``"tp-cp-dp-pp"``.

    Axes are given as names (``"cp"``, ``"dp,cp"``, ``("dp", "cp")``) or
    ``CP_AXIS_*`` bits.
    """

    _kind = "topology"
    _destroy = "cp_topology_destroy"

    def __init__(self, world_size, tp=1, cp=1, dp=0, pp=1, cp_a2a=1, order=None):
        if order is not None and not isinstance(order, str):
            raise argument_error("order = %r: expected a string such as 'tp-cp-dp-pp'" % (order,))
        self._order = None if order is None else order.encode()
        cfg = _lib.TopologyConfig(world_size=_int(world_size, "world_size"), tp=_int(tp, "tp"), cp=_int(cp, "cp"),
                                  dp=_int(dp, "dp"), pp=_int(pp, "pp"), cp_a2a=_int(cp_a2a, "cp_a2a"),
                                  order=self._order)
        self._init_res()
        h = ctypes.c_void_p()
        check(_lib.get().cp_topology_create(byref(cfg), byref(h)))
        self._res.attach(h.value)
        self.world_size = cfg.world_size
        self.tp, self.cp, self.pp, self.cp_a2a = cfg.tp, cfg.cp, cfg.pp, cfg.cp_a2a
        self.dp = cfg.dp or cfg.world_size // (cfg.tp * cfg.cp * cfg.pp)
        self.order = order or "tp-cp-dp-pp"

    def __repr__(self):
        return "Topology(world_size=%d, tp=%d, cp=%d, dp=%d, pp=%d, cp_a2a=%d, order=%r)" % (
            self.world_size, self.tp, self.cp, self.dp, self.pp, self.cp_a2a, self.order)

    def coords(self, rank):
        """The coordinates of ``rank``, a :data:`Coords` named tuple
        (``._asdict()`` gives a dict)."""
        c = _lib.Coords()
        check(_lib.get().cp_topology_coords(self._h, _int(rank, "rank"), byref(c)))
        return Coords(c.tp, c.cp, c.dp, c.pp, c.cp_a2a, c.cp_p2p)

    def rank(self, coords=None, **kw):
        """The rank of a coordinate tuple (the inverse of :meth:`coords`):
        a :data:`Coords`, a dict, or keywords; cp and (cp_a2a, cp_p2p)
        complete each other when only one is given."""
        d = dict(coords._asdict() if hasattr(coords, "_asdict") else (coords or {}))
        d.update(kw)
        d = {k: _int(v, k) for k, v in d.items()}
        for k in d:
            if k not in Coords._fields:
                raise argument_error("Topology.rank: unknown coordinate %r" % k)
        if "cp" in d and ("cp_a2a" not in d or "cp_p2p" not in d):
            d.setdefault("cp_a2a", d["cp"] % self.cp_a2a)
            d.setdefault("cp_p2p", d["cp"] // self.cp_a2a)
        elif "cp" not in d:
            d["cp"] = d.get("cp_a2a", 0) + d.get("cp_p2p", 0) * self.cp_a2a
        c = _lib.Coords(**{k: d.get(k, 0) for k in Coords._fields})
        r = ctypes.c_int()
        check(_lib.get().cp_topology_rank(self._h, byref(c), byref(r)))
        return r.value

    def group(self, rank, axes):
        """The ranks that differ from ``rank`` only along ``axes``, sorted (a
        list of ints); e.g. ``group(r, "cp")`` is r's CP group, indexed by
        the cp coordinate."""
        lib = _lib.get()
        bits = _axes(axes)
        n = ctypes.c_int()
        check(lib.cp_topology_group(self._h, _int(rank, "rank"), bits, None, 0, byref(n), None))
        ranks = (ctypes.c_int * max(n.value, 1))()
        check(lib.cp_topology_group(self._h, rank, bits, ranks, n.value, byref(n), None))
        return list(ranks[:n.value])

    def color(self, rank, axes):
        """``(color, key)`` that split a world communicator into the groups
        of :meth:`group` (``Comm.split(color, key)``)."""
        c, k = ctypes.c_int(), ctypes.c_int()
        check(_lib.get().cp_topology_color(self._h, _int(rank, "rank"), _axes(axes), byref(c), byref(k)))
        return c.value, k.value

    def is_writer(self, rank, role="replicated"):
        """Whether ``rank`` writes checkpoint state of ``role``
        (``"replicated"`` or ``"sharded"``; ``cp_ckpt_is_writer``)."""
        w = ctypes.c_int()
        check(_lib.get().cp_ckpt_is_writer(self._h, _int(rank, "rank"), _choice(role, _ROLES, "role"), byref(w)))
        return bool(w.value)

    def seq_local_len(self, desc):
        """Tokens of one sequence a rank holds under CP for an attention
        description (an :class:`AttnDesc` or :class:`AttnPlan`)."""
        d = _desc_of(desc)._c()
        n = ctypes.c_int64()
        check(_lib.get().cp_seq_local_len(self._h, byref(d), byref(n)))
        return n.value

    def stage_shape(self, desc, hidden, sequence_parallel=False):
        """Shape and bytes of the activation a rank sends to the next
        pipeline stage: ``((d0, d1, d2), nbytes)`` (``cp_stage_shape``)."""
        d = _desc_of(desc)._c()
        shape = (ctypes.c_int64 * 3)()
        nbytes = ctypes.c_size_t()
        check(_lib.get().cp_stage_shape(self._h, byref(d), _int(hidden, "hidden"), 1 if sequence_parallel else 0,
                                        shape, byref(nbytes)))
        return tuple(shape), nbytes.value


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------


def layout_positions(layout, cp_size, cp_rank, seq_len):
    """Global positions of the tokens CP rank ``cp_rank`` of ``cp_size``
    holds, in local order: an int64 NumPy array of ``seq_len / cp_size``
    (``cp_layout_positions``; layout ``"contiguous"`` or ``"zigzag"``)."""
    lay = _choice(layout, _LAYOUTS, "layout")
    p, r, s = _int(cp_size, "cp_size"), _int(cp_rank, "cp_rank"), _int(seq_len, "seq_len")
    n = s // p if p >= 1 and s >= 1 else 0
    out = np.zeros(max(n, 1), dtype=np.int64)
    check(_lib.get().cp_layout_positions(lay, p, r, s, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))))
    return out[:n]


def _token_split(ref, dim, what):
    nd = len(ref.shape)
    if not -nd <= dim < nd:
        raise argument_error("%s: dim = %d is out of range for an array of %d dimensions" % (what, dim, nd))
    dim %= nd
    outer = int(np.prod(ref.shape[:dim], dtype=np.int64))
    inner = int(np.prod(ref.shape[dim + 1:], dtype=np.int64)) * ref.itemsize
    return dim, outer, ref.shape[dim], inner


def layout_shard(x, layout, cp_size, cp_rank, dim=1, ctx=None):
    """CP rank ``cp_rank``'s share of ``x`` along its token dimension
    ``dim`` (``cp_layout_shard``): a new array with ``shape[dim] / cp_size``
    tokens, in the order :func:`layout_positions` lists them. The
    dimensions before ``dim`` count as the batch. ``ctx``: the context of
    the array's device (None: a CPU array, on a context of this thread)."""
    what = "layout_shard"
    ref = _arrays.view(x, what + ": x")
    if not ref.contiguous:
        raise argument_error("%s: x must be C-contiguous" % what)
    dim, outer, seq, inner = _token_split(ref, dim, what)
    p = _int(cp_size, "cp_size")
    shape = list(ref.shape)
    shape[dim] = seq // p if p >= 1 else 0
    out = _arrays.empty_like(ref, shape)
    oref = _arrays.view(out, what)
    c = _context_for(ref, ctx, what)
    check(_lib.get().cp_layout_shard(c._h, _choice(layout, _LAYOUTS, "layout"), p, _int(cp_rank, "cp_rank"),
                                     ref.ptr or None, oref.ptr or None, outer, seq, inner))
    return out


# ---------------------------------------------------------------------------
# CP groups
# ---------------------------------------------------------------------------


class Group(_Handle):
    """A CP group: a context plus the CP communicator (collective over
    ``comm``; ``cp_group_create``).

    Args:
        ctx: the :class:`Context` the group's work runs on.
        comm: the CP :class:`Comm`.
        a2a_size: the a2a sub-group size of mode ``"a2a_p2p"``
            (consecutive cp ranks); the same on every rank.
        timeout_ms: the longest wait for a peer before ``Status.TIMEOUT``.
        num_streams: compute streams for overlap on device backends.

    The group keeps ``ctx`` and ``comm`` alive; closing either closes the
    group (and its plans) first.
    """

    _kind = "group"
    _destroy = "cp_group_destroy"

    def __init__(self, ctx, comm, a2a_size=1, timeout_ms=300000, num_streams=2):
        if not isinstance(comm, Comm):
            raise argument_error("Group: comm must be a Comm, got %s" % type(comm).__name__)
        lib = _lib.get()
        h = ctypes.c_void_p()
        try:
            if not isinstance(ctx, Context):
                raise argument_error("Group: ctx must be a Context, got %s" % type(ctx).__name__)
            cfg = _lib.GroupConfig(a2a_size=_int(a2a_size, "a2a_size"), timeout_ms=_int(timeout_ms, "timeout_ms"),
                                   num_streams=_int(num_streams, "num_streams"))
            ctx_h = ctx._h
        except Error:
            # take part all the same (out = NULL), so that peers fail at once
            lib.cp_group_create(None, comm._h, None, None)
            raise
        self._init_res(parents=(ctx, comm))
        check(lib.cp_group_create(ctx_h, comm._h, byref(cfg), byref(h)))
        self._res.attach(h.value)
        self.context = ctx
        self.comm = comm
        self.a2a_size = cfg.a2a_size
        self.timeout_ms = cfg.timeout_ms
        r, n = ctypes.c_int(), ctypes.c_int()
        check(lib.cp_group_rank(h.value, byref(r)))
        check(lib.cp_group_size(h.value, byref(n)))
        self.rank = r.value
        self.size = n.value

    def __repr__(self):
        return "Group(rank=%d, size=%d, a2a_size=%d%s)" % (self.rank, self.size, self.a2a_size,
                                                           ", closed" if self.closed else "")

    def gather(self, local, layout="contiguous", dim=1):
        """Reassemble a sequence from every rank's share (collective):
        ``local`` holds this rank's tokens along ``dim`` in ``layout``
        (``"contiguous"``, ``"zigzag"``, or a :class:`Pack` for packed
        rows); returns the whole array, ``size`` times longer along
        ``dim`` (``cp_layout_gather`` / ``cp_pack_gather``)."""
        if isinstance(layout, Pack):
            return layout.gather(self, local, dim=dim)
        what = "Group.gather"
        ref = _arrays.view(local, what + ": local")
        lay = _choice(layout, _LAYOUTS, "layout")
        if not ref.contiguous:
            raise argument_error("%s: local must be C-contiguous" % what)
        dim, outer, seq, inner = _token_split(ref, dim, what)
        shape = list(ref.shape)
        shape[dim] = seq * self.size
        out = _arrays.empty_like(ref, shape)
        oref = _arrays.view(out, what)
        check(_lib.get().cp_layout_gather(self._h, lay, ref.ptr or None, oref.ptr or None, outer, shape[dim], inner))
        return out


# ---------------------------------------------------------------------------
# Attention descriptions and plans
# ---------------------------------------------------------------------------


class AttnDesc:
    """One CP attention's description (``cp_attn_desc``): the arguments of
    :class:`AttnPlan` without the group. Fields are plain attributes; names
    (``"float32"``, ``"zigzag"``, ...) are kept as given to the
    constructor after checking. ``AttnPlan.desc`` is one."""

    _FIELDS = ("dtype", "batch", "seq_len", "num_heads", "num_kv_heads", "head_dim", "head_dim_v", "causal", "layout",
               "mode", "format", "softmax_scale", "window", "softcap", "sinks")

    def __init__(self, dtype="float32", batch=None, seq_len=None, num_heads=None, num_kv_heads=None, head_dim=None,
                 head_dim_v=0, causal=True, layout="contiguous", mode="p2p", format="bshd", softmax_scale=0.0,
                 window=0, softcap=0.0, sinks=False):
        for name, value in (("batch", batch), ("seq_len", seq_len), ("num_heads", num_heads),
                            ("head_dim", head_dim)):
            if value is None:
                raise argument_error("%s is required" % name)
        self.dtype = _dtype_name(dtype)
        self.batch = _int(batch, "batch")
        self.seq_len = _int(seq_len, "seq_len")
        self.num_heads = _int(num_heads, "num_heads")
        self.num_kv_heads = self.num_heads if num_kv_heads is None else _int(num_kv_heads, "num_kv_heads")
        self.head_dim = _int(head_dim, "head_dim")
        self.head_dim_v = _int(head_dim_v or 0, "head_dim_v")
        self.causal = bool(causal)
        self.layout = _name_of(_LAYOUTS, _choice(layout, _LAYOUTS, "layout"))
        self.mode = _name_of(_MODES, _choice(mode, _MODES, "mode"))
        self.format = _name_of(_FORMATS, _choice(format, _FORMATS, "format"))
        self.softmax_scale = _float(softmax_scale, "softmax_scale")
        self.window = _int(window, "window")
        self.softcap = _float(softcap, "softcap")
        self.sinks = bool(sinks)

    def _c(self):
        return _lib.AttnDescC(dtype=_DTYPES[self.dtype], format=_FORMATS[self.format], batch=self.batch,
                              seq_len=self.seq_len, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                              head_dim=self.head_dim, head_dim_v=self.head_dim_v, mask=1 if self.causal else 0,
                              softmax_scale=self.softmax_scale, layout=_LAYOUTS[self.layout], mode=_MODES[self.mode],
                              window=self.window, softcap=self.softcap, sinks=1 if self.sinks else 0)

    def as_dict(self):
        """The fields as a dict (keyword arguments of AttnPlan)."""
        return {k: getattr(self, k) for k in self._FIELDS}

    def __repr__(self):
        return "AttnDesc(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())

    def __eq__(self, other):
        return isinstance(other, AttnDesc) and self.as_dict() == other.as_dict()


def _desc_of(d):
    if isinstance(d, AttnPlan):
        return d.desc
    if isinstance(d, AttnDesc):
        return d
    if isinstance(d, dict):
        return AttnDesc(**d)
    raise argument_error("expected an AttnPlan, an AttnDesc or a dict of its fields, got %s" % type(d).__name__)


def _dtype_ok(plan_dtype, arr_dtype):
    return (arr_dtype == plan_dtype or (plan_dtype == "bfloat16" and arr_dtype == "uint16")
            or (plan_dtype == _FP8 and arr_dtype == "uint8"))


def _descale_args(args, descales, counts, like, func, problems):
    """Put the descales of an FP8 forward (numbers, or arrays of 1 or
    ``counts[i]`` values: per tensor or per head; a mix is made per head)
    into ``args`` as float32 arrays on ``like``'s device; returns the arrays
    to keep alive for the call."""
    names = ("q_descale", "k_descale", "v_descale")
    sizes = []
    for name, value, n in zip(names, descales, counts):
        if value is None:
            sizes.append(0)
            continue
        if isinstance(value, bool):
            problems.append("%s: %s = %r: expected a number or an array" % (func, name, value))
            return []
        try:
            size = int(value.numel()) if hasattr(value, "numel") else int(np.prod(np.shape(value)))
        except Exception:  # noqa: BLE001 - not array-like
            problems.append("%s: %s = %r: expected a number or an array" % (func, name, value))
            return []
        if size not in (1, n):
            problems.append("%s: %s has %d values, expected 1 (per tensor) or %d (per head)" % (func, name, size, n))
            return []
        sizes.append(size)
    per_head = any(s > 1 for s in sizes)
    keep = []
    for name, value, n in zip(names, descales, counts):
        if value is None:
            continue
        try:
            arr = _arrays.float32_vector(like, value, n if per_head else None)
        except (Error, TypeError, ValueError) as e:
            problems.append("%s: %s = %r: %s" % (func, name, value, getattr(e, "message", e)))
            return []
        setattr(args, name, _arrays.view(arr, "%s: %s" % (func, name)).ptr)
        keep.append(arr)
    args.descale_per_head = 1 if per_head else 0
    return keep


class AttnPlan(_Handle):
    """One CP attention planned on a group (collective;
    ``cp_attn_plan_create``).

    Args:
        group: the CP :class:`Group` (kept alive by the plan).
        dtype: storage type of q, k, v, out and gradients: ``"float32"``,
            ``"float16"`` or ``"bfloat16"`` (NumPy and CuPy: ``uint16``
            arrays of bf16 bits; NumPy also ``ml_dtypes.bfloat16``); or
            ``"fp8_e4m3"`` (API 1.2): q, k, v in OCP FP8 E4M3 (PyTorch's
            ``torch.float8_e4m3fn``, ``ml_dtypes.float8_e4m3fn``, or
            ``uint8`` arrays of the codes), out in bfloat16, forward only,
            with per-tensor or per-head descales (:meth:`forward`).
        batch: sequences per batch (1 for ``layout="packed"``).
        seq_len: the GLOBAL sequence length (all ranks together).
        num_heads, num_kv_heads: query and key/value heads (GQA when
            fewer kv heads; None = num_heads).
        head_dim, head_dim_v: q/k and v/out head dims (0 = head_dim).
        causal: causal mask on global positions, else none.
        layout: ``"contiguous"``, ``"zigzag"`` or ``"packed"`` (documents
            of a :class:`Pack` in one row).
        mode: ``"all_gather"``, ``"p2p"``, ``"a2a"`` or ``"a2a_p2p"``.
        format: ``"bshd"`` ([batch, tokens, heads, dim]) or ``"sbhd"``.
        softmax_scale: 0 = 1/sqrt(head_dim).
        window: sliding window (0 = none).
        softcap: logit softcap (0 = none).
        sinks: one learned sink logit per query head.

    Every rank of the group makes the same plan. Arrays hold this rank's
    ``seq_len / group.size`` tokens in the layout's order, dense, in the
    plan's dtype, on the context's device: NumPy arrays on a CPU context;
    on a CUDA context PyTorch tensors, CuPy arrays, or any object with
    ``__cuda_array_interface__`` or DLPack (kinds may be mixed). An array
    on another device raises :class:`ArgumentError` naming it. Outputs are
    allocated like ``q`` on its device (see :meth:`forward`).
    """

    _kind = "plan"
    _destroy = "cp_attn_plan_destroy"

    def __init__(self, group, dtype="float32", batch=None, seq_len=None, num_heads=None, num_kv_heads=None,
                 head_dim=None, head_dim_v=0, causal=True, layout="contiguous", mode="p2p", format="bshd",
                 softmax_scale=0.0, window=0, softcap=0.0, sinks=False):
        if not isinstance(group, Group):
            raise argument_error("AttnPlan: group must be a Group, got %s" % type(group).__name__)
        lib = _lib.get()
        g = group._h
        try:
            desc = AttnDesc(dtype, batch, seq_len, num_heads, num_kv_heads, head_dim, head_dim_v, causal, layout,
                            mode, format, softmax_scale, window, softcap, sinks)
        except Error as e:
            lib.cp_attn_plan_create(g, None, None)  # take part, so that peers fail at once
            raise argument_error("AttnPlan: %s" % e.message) from None
        c = desc._c()
        self._init_res(parents=(group,))
        h = ctypes.c_void_p()
        check(lib.cp_attn_plan_create(g, byref(c), byref(h)))
        self._res.attach(h.value)
        self.desc = desc
        self.group = group
        self.cp_size = group.size
        self.cp_rank = group.rank
        self.local_seq_len = desc.seq_len // group.size
        self._args = None

    def __repr__(self):
        return "AttnPlan(cp_rank=%d, cp_size=%d, %s)" % (self.cp_rank, self.cp_size, repr(self.desc)[9:-1])

    def __getattr__(self, name):
        # the description's fields read as the plan's: plan.dtype, plan.layout, ...
        if name in AttnDesc._FIELDS and "desc" in self.__dict__:
            return getattr(self.__dict__["desc"], name)
        raise AttributeError(name)

    # -- shapes --------------------------------------------------------

    def _shape(self, heads, dim):
        d = self.desc
        t = self.local_seq_len
        return (d.batch, t, heads, dim) if d.format == "bshd" else (t, d.batch, heads, dim)

    @property
    def q_shape(self):
        """Shape of this rank's q (and dq)."""
        return self._shape(self.desc.num_heads, self.desc.head_dim)

    @property
    def k_shape(self):
        """Shape of this rank's k (and dk)."""
        return self._shape(self.desc.num_kv_heads, self.desc.head_dim)

    @property
    def v_shape(self):
        """Shape of this rank's v (and dv)."""
        return self._shape(self.desc.num_kv_heads, self.desc.head_dim_v or self.desc.head_dim)

    @property
    def out_shape(self):
        """Shape of this rank's out (and dout)."""
        return self._shape(self.desc.num_heads, self.desc.head_dim_v or self.desc.head_dim)

    @property
    def lse_shape(self):
        """Shape of this rank's log-sum-exp, float32 [batch, num_heads, tokens]."""
        return (self.desc.batch, self.desc.num_heads, self.local_seq_len)

    @property
    def out_dtype(self):
        """Element type of out: the plan's dtype, bfloat16 for an FP8 plan."""
        return "bfloat16" if self.desc.dtype == _FP8 else self.desc.dtype

    def workspace_size(self):
        """``(forward_bytes, backward_bytes)`` of workspace the plan's calls
        use (``cp_attn_workspace_size``); the plan allocates its own."""
        f, b = ctypes.c_size_t(), ctypes.c_size_t()
        check(_lib.get().cp_attn_workspace_size(self._h, byref(f), byref(b)))
        return f.value, b.value

    # -- checks ----------------------------------------------------------

    def _tensor(self, obj, name, shape, dtype, func, problems):
        """Check one array; record the first problem; return its ArrayRef."""
        ctx = self.group.context
        try:
            ref = _arrays.view(obj, "%s: %s" % (func, name), stream=ctx.stream if ctx.device == "cuda" else None)
        except Error as e:
            problems.append(e.message)
            return None
        if not _dtype_ok(dtype, ref.dtype):
            problems.append("%s: %s has dtype %s, the plan needs %s%s" % (
                func, name, ref.dtype, dtype, " (or uint16 bf16 bits)" if dtype == "bfloat16" else ""))
        elif ref.shape != tuple(shape):
            problems.append("%s: %s has shape %s, the plan needs %s (%s)" % (
                func, name, ref.shape, tuple(shape), self._shape_doc(name)))
        elif ref.device != ctx.device or (ref.device == "cuda" and ref.device_index not in (-1, ctx.device_index)):
            where = ref.device if ref.device_index < 0 else "%s:%d" % (ref.device, ref.device_index)
            problems.append("%s: %s is on %s, the plan's context on %s:%d" % (
                func, name, where, ctx.device, ctx.device_index))
        elif not ref.contiguous:
            problems.append("%s: %s is not C-contiguous" % (func, name))
        elif not ref.aligned:
            problems.append("%s: %s is not aligned to its elements" % (func, name))
        return ref

    def _shape_doc(self, name):
        d = self.desc
        t = "seq_len / cp_size = %d / %d" % (d.seq_len, self.cp_size)
        if name == "lse":
            return "batch, num_heads, " + t
        if name == "sinks":
            return "num_heads"
        heads = "num_heads" if name in ("q", "dq", "out", "dout") else "num_kv_heads"
        dim = "head_dim_v" if name in ("v", "dv", "out", "dout") else "head_dim"
        return ("batch, %s, %s, %s" if d.format == "bshd" else "%s, batch, %s, %s") % (t, heads, dim)

    def _extra(self, pack, sinks, func, problems, backward):
        """The cp_attn_args of a call, the sinks' ArrayRef and the dsinks
        output (or None)."""
        args = _lib.AttnArgs()
        sref = dsinks = None
        if pack is not None:
            if isinstance(pack, Pack) and not pack.closed:
                args.pack = pack._h
            else:
                problems.append("%s: pack must be an open Pack, got %r" % (func, pack))
        if sinks is not None:
            sref = self._tensor(sinks, "sinks", (self.desc.num_heads,), "float32", func, problems)
            if sref is not None and not problems:
                args.sinks = sref.ptr
                if backward and self.desc.sinks:
                    dsinks = _arrays.empty_like(sref, (self.desc.num_heads,))
                    args.dsinks = _arrays.view(dsinks, "dsinks").ptr
        return args, sref, dsinks

    # -- calls -----------------------------------------------------------

    def forward(self, q, k, v, pack=None, sinks=None, q_descale=None, k_descale=None, v_descale=None):
        """CP attention forward (collective over the group): returns
        ``(out, lse)`` for this rank's queries, allocated like ``q`` (out in
        the plan's dtype, bfloat16 for an FP8 plan; lse float32 [batch,
        num_heads, tokens]): NumPy
        for NumPy, PyTorch for PyTorch, CuPy for CuPy; for a CUDA ``q`` of
        another kind (only ``__cuda_array_interface__`` or DLPack), CuPy
        arrays when CuPy can be imported, else PyTorch tensors (bfloat16:
        PyTorch first, else CuPy ``uint16`` bits), on q's device.

        ``pack``: the :class:`Pack` of a packed plan (the same on every
        rank). ``sinks``: a plan with sinks takes the num_heads float32 sink
        logits (host memory). ``q_descale``, ``k_descale``, ``v_descale``:
        an FP8 plan's dequantisation scales (a stored element's value is
        its FP8 value times the descale; None = 1): numbers, or arrays of
        one value (per tensor) or of num_heads (q) / num_kv_heads (k, v)
        values (per head; the whole tensor's heads, equal on every rank).
        Bad arguments raise :class:`ArgumentError` after this rank has
        still taken part in the call, so that the other ranks fail at once
        with ``Status.MISMATCH``.
        """
        func = "AttnPlan.forward"
        h = self._h
        lib = _lib.get()
        problems = []
        d = self.desc
        qr = self._tensor(q, "q", self.q_shape, d.dtype, func, problems)
        kr = self._tensor(k, "k", self.k_shape, d.dtype, func, problems)
        vr = self._tensor(v, "v", self.v_shape, d.dtype, func, problems)
        args, _, _ = self._extra(pack, sinks, func, problems, False)
        descales = (q_descale, k_descale, v_descale)
        keep = []
        if any(x is not None for x in descales) and not problems:
            if d.dtype != _FP8:
                problems.append("%s: descales are for FP8 plans (dtype 'fp8_e4m3'); the plan's dtype is %s"
                                % (func, d.dtype))
            else:
                keep = _descale_args(args, descales, (d.num_heads, d.num_kv_heads, d.num_kv_heads), qr, func,
                                     problems)
        if problems:
            lib.cp_attn_forward_ex(h, None, None, None, None, None, None)  # take part, then fail
            raise argument_error(problems[0])
        out = _arrays.empty_like(qr, self.out_shape, None if d.dtype != _FP8 else "bfloat16")
        lse = _arrays.empty_like(qr, self.lse_shape, "float32")
        o = _arrays.view(out, "out")
        ls = _arrays.view(lse, "lse")
        check(lib.cp_attn_forward_ex(h, qr.ptr, kr.ptr, vr.ptr, o.ptr, ls.ptr, byref(args)))
        del keep
        return out, lse

    def backward(self, q, k, v, out, lse, dout, pack=None, sinks=None):
        """CP attention backward (collective over the group): returns
        ``(dq, dk, dv)``, and ``dsinks`` last when the plan has sinks
        (this rank's share of the sinks' gradient, float32 [num_heads]:
        sum it over the ranks like any replicated parameter's gradient).
        ``out`` and ``lse`` are the forward's; ``dout`` the gradient of the
        loss with respect to ``out``. dk and dv are summed over every
        rank's queries. An FP8 plan has no backward: it raises
        :class:`Error` with ``Status.UNSUPPORTED`` (after taking part in the
        call, so that the other ranks fail at once too)."""
        func = "AttnPlan.backward"
        h = self._h
        lib = _lib.get()
        problems = []
        d = self.desc
        if d.dtype == _FP8:
            lib.cp_attn_backward_ex(h, None, None, None, None, None, None, None, None, None, None)  # take part
            raise Error(Status.UNSUPPORTED, "%s: the plan's dtype is fp8_e4m3 (float8_e4m3fn): FP8 plans are "
                        "forward only (API 1.2); a backward needs a float32, float16 or bfloat16 plan" % func)
        qr = self._tensor(q, "q", self.q_shape, d.dtype, func, problems)
        kr = self._tensor(k, "k", self.k_shape, d.dtype, func, problems)
        vr = self._tensor(v, "v", self.v_shape, d.dtype, func, problems)
        orf = self._tensor(out, "out", self.out_shape, d.dtype, func, problems)
        lr = self._tensor(lse, "lse", self.lse_shape, "float32", func, problems)
        dr = self._tensor(dout, "dout", self.out_shape, d.dtype, func, problems)
        args, _, dsinks = self._extra(pack, sinks, func, problems, True)
        if problems:
            lib.cp_attn_backward_ex(h, None, None, None, None, None, None, None, None, None, None)
            raise argument_error(problems[0])
        dq = _arrays.empty_like(qr, self.q_shape)
        dk = _arrays.empty_like(qr, self.k_shape)
        dv = _arrays.empty_like(qr, self.v_shape)
        p = [_arrays.view(a, "grad").ptr for a in (dq, dk, dv)]
        check(lib.cp_attn_backward_ex(h, qr.ptr, kr.ptr, vr.ptr, orf.ptr, lr.ptr, dr.ptr, p[0], p[1], p[2],
                                      byref(args)))
        if d.sinks:
            return dq, dk, dv, dsinks
        return dq, dk, dv


# ---------------------------------------------------------------------------
# Packed documents
# ---------------------------------------------------------------------------


class Pack(_Handle):
    """The split of one packed row of documents across a CP group
    (``cp_pack_create``): host only, no communication, deterministic, so
    every rank makes its own from the same arguments.

    Args:
        cp_size: P, the CP group size.
        cu_seqlens: the document boundaries, ``0 = cu[0] < cu[1] < ... <
            cu[n] = T`` (T divisible by P).
        causal, window: the attention the split balances for (normally
            the plan's).
        balance: ``"auto"``, ``"greedy"``, ``"contiguous"`` or
            ``"doc_zigzag"``.
        chunk: the granularity of ``"greedy"`` in tokens (0 = the
            library's choice).
    """

    _kind = "pack"
    _destroy = "cp_pack_destroy"

    def __init__(self, cp_size, cu_seqlens, causal=True, window=0, balance="auto", chunk=0):
        try:
            cu = np.array(cu_seqlens, dtype=np.int64, copy=True).reshape(-1)
        except (TypeError, ValueError):
            raise argument_error("Pack: cu_seqlens = %r: expected a sequence of integers" % (cu_seqlens,)) from None
        if cu.size == 0:
            cu = np.zeros(1, dtype=np.int64)
        cfg = _lib.PackConfig(cp_size=_int(cp_size, "cp_size"),
                              cu_seqlens=cu.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), num_seqs=cu.size - 1,
                              mask=1 if causal else 0, window=_int(window, "window"),
                              balance=_choice(balance, _BALANCES, "balance"), chunk=_int(chunk, "chunk"))
        self._init_res()
        h = ctypes.c_void_p()
        check(_lib.get().cp_pack_create(byref(cfg), byref(h)))
        self._res.attach(h.value)
        cu.setflags(write=False)
        self.cu_seqlens = cu
        self.cp_size = cfg.cp_size
        self.seq_len = int(cu[-1])
        self.num_seqs = cfg.num_seqs
        self.local_len = self.seq_len // self.cp_size
        self.causal = bool(causal)
        self.window = cfg.window
        self.balance = _name_of(_BALANCES, cfg.balance)
        self.chunk = cfg.chunk

    def __repr__(self):
        return "Pack(cp_size=%d, seq_len=%d, num_seqs=%d, balance=%r)" % (self.cp_size, self.seq_len, self.num_seqs,
                                                                         self.balance)

    def _positions(self, rank, which):
        n = self.local_len
        out = np.empty(max(n, 1), dtype=np.int32 if which == 2 else np.int64)
        ptrs = [None, None, None]
        ptrs[which] = out.ctypes.data
        check(_lib.get().cp_pack_positions(self._h, _int(rank, "rank"), *ptrs))
        return out[:n]

    def positions(self, rank):
        """The packed-row indices of rank's T / P tokens, in local order
        (int64)."""
        return self._positions(rank, 0)

    def doc_positions(self, rank):
        """Each of rank's tokens' position inside its document (int64; the
        position ids for rotary embeddings)."""
        return self._positions(rank, 1)

    def doc_ids(self, rank):
        """Each of rank's tokens' document index (int32)."""
        return self._positions(rank, 2)

    def work(self, rank):
        """The number of visible (query, key) pairs of rank's queries under
        the pack's mask and window (a float, exact up to 2^53)."""
        pairs = ctypes.c_double()
        check(_lib.get().cp_pack_work(self._h, _int(rank, "rank"), byref(pairs)))
        return pairs.value

    def shard(self, x, rank, dim=0, ctx=None):
        """Rank's tokens of the whole row ``x`` (T tokens along ``dim``; the
        dimensions before it must have size 1), in local order
        (``cp_pack_shard``). ``ctx`` as in :func:`layout_shard`."""
        what = "Pack.shard"
        ref = _arrays.view(x, what + ": x")
        if not ref.contiguous:
            raise argument_error("%s: x must be C-contiguous" % what)
        dim, outer, seq, inner = _token_split(ref, dim, what)
        if outer != 1:
            raise argument_error("%s: the dimensions before dim %d hold %d rows; a packed row is one" % (
                what, dim, outer))
        shape = list(ref.shape)
        shape[dim] = self.local_len
        out = _arrays.empty_like(ref, shape)
        oref = _arrays.view(out, what)
        c = _context_for(ref, ctx, what)
        if seq != self.seq_len:
            raise argument_error("%s: x has %d tokens along dim %d, the pack %d" % (what, seq, dim, self.seq_len))
        check(_lib.get().cp_pack_shard(c._h, self._h, _int(rank, "rank"), ref.ptr or None, oref.ptr or None, inner))
        return out

    def gather(self, group, local, dim=0):
        """The whole row from every rank's share (collective over
        ``group``; ``cp_pack_gather``): ``local`` holds T / P tokens along
        ``dim``."""
        what = "Pack.gather"
        if not isinstance(group, Group):
            raise argument_error("%s: group must be a Group" % what)
        ref = _arrays.view(local, what + ": local")
        if not ref.contiguous:
            raise argument_error("%s: local must be C-contiguous" % what)
        dim, outer, seq, inner = _token_split(ref, dim, what)
        shape = list(ref.shape)
        shape[dim] = self.seq_len
        out = _arrays.empty_like(ref, shape)
        oref = _arrays.view(out, what)
        check(_lib.get().cp_pack_gather(group._h, self._h, ref.ptr or None, oref.ptr or None, inner))
        return out


# ---------------------------------------------------------------------------
# Checkpoint metadata
# ---------------------------------------------------------------------------


class Verdict(enum.IntEnum):
    """Whether a checkpoint can be resumed (``cp_ckpt_verdict``)."""

    IDENTICAL = 0
    COMPATIBLE = 1
    NEEDS_RESHARD = 2
    INCOMPATIBLE = 3


CheckResult = collections.namedtuple("CheckResult", ["verdict", "reason"])
CheckResult.__doc__ = "The result of CkptMeta.check: a Verdict and the library's one-line reason."


class CkptMeta(_Handle):
    """The CP setup of a run, recorded with its checkpoints
    (``cp_ckpt_meta_create``).

    ``CkptMeta(topology, desc)``: from a :class:`Topology` and an attention
    description (an :class:`AttnPlan`, :class:`AttnDesc` or a dict of its
    fields). :meth:`load` and :meth:`from_json` read saved ones;
    ``saved.check(current)`` tells whether a checkpoint can be resumed.
    """

    _kind = "ckpt_meta"
    _destroy = "cp_ckpt_meta_destroy"

    def __init__(self, topology, desc):
        if not isinstance(topology, Topology):
            raise argument_error("CkptMeta: topology must be a Topology, got %s" % type(topology).__name__)
        d = _desc_of(desc)._c()
        self._init_res()
        h = ctypes.c_void_p()
        check(_lib.get().cp_ckpt_meta_create(topology._h, byref(d), byref(h)))
        self._res.attach(h.value)

    @classmethod
    def _wrap(cls, handle):
        self = object.__new__(cls)
        self._init_res()
        self._res.attach(handle)
        return self

    @classmethod
    def load(cls, path):
        """Read metadata saved by :meth:`save` (``cp_ckpt_meta_load``)."""
        out = ctypes.c_void_p()
        check(_lib.get().cp_ckpt_meta_load(os.fsencode(path), byref(out)))
        return cls._wrap(out.value)

    @classmethod
    def from_json(cls, text):
        """Parse a JSON document written by :meth:`to_json` (str or bytes)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out = ctypes.c_void_p()
        check(_lib.get().cp_ckpt_meta_from_json(data, len(data), byref(out)))
        return cls._wrap(out.value)

    def save(self, path):
        """Write the metadata as JSON to ``path``, atomically
        (``cp_ckpt_meta_save``)."""
        check(_lib.get().cp_ckpt_meta_save(self._h, os.fsencode(path)))

    def to_json(self):
        """The JSON document (a str)."""
        lib = _lib.get()
        n = ctypes.c_size_t()
        check(lib.cp_ckpt_meta_to_json(self._h, None, 0, byref(n)))
        buf = ctypes.create_string_buffer(n.value + 1)
        check(lib.cp_ckpt_meta_to_json(self._h, buf, n.value + 1, byref(n)))
        return buf.raw[:n.value].decode("utf-8")

    def get(self, key):
        """One integer field by its JSON key (``"cp"``, ``"seq_len"``, ...;
        ``"mode"``, ``"layout"`` and ``"dtype"`` give their enum values)."""
        v = ctypes.c_int64()
        check(_lib.get().cp_ckpt_meta_get(self._h, key.encode(), byref(v)))
        return v.value

    def __getitem__(self, key):
        return self.get(key)

    def check(self, current):
        """Whether a checkpoint saved with this metadata can be resumed by a
        run with ``current``'s: a :data:`CheckResult` ``(verdict,
        reason)``."""
        if not isinstance(current, CkptMeta):
            raise argument_error("CkptMeta.check: current must be a CkptMeta, got %s" % type(current).__name__)
        v = ctypes.c_int()
        reason = ctypes.create_string_buffer(1024)
        check(_lib.get().cp_ckpt_meta_check(self._h, current._h, byref(v), reason, len(reason)))
        return CheckResult(Verdict(v.value), reason.value.decode("utf-8", "replace"))


# ---------------------------------------------------------------------------
# Single-device kernels
# ---------------------------------------------------------------------------


def _kernel_args(ctx, q, k, v, causal, q_offset, k_offset, softmax_scale, window, softcap, format, rects, func,
                 dtype=None):
    if not isinstance(ctx, Context):
        raise argument_error("%s: ctx must be a Context" % func)
    refs = []
    for name, obj in (("q", q), ("k", k), ("v", v)):
        r = _arrays.view(obj, "%s: %s" % (func, name))
        if not r.contiguous or len(r.shape) != 4:
            raise argument_error("%s: %s must be a C-contiguous 4-d array" % (func, name))
        refs.append(r)
    qr, kr, vr = refs
    if dtype is not None:
        dtype = _dtype_name(dtype)
    elif qr.dtype == "uint8":
        raise argument_error("%s: q is a uint8 array: FP8 codes need dtype='fp8_e4m3'" % func)
    else:
        dtype = "bfloat16" if qr.dtype == "uint16" else qr.dtype
    if dtype not in _DTYPES or any(not _dtype_ok(dtype, r.dtype) for r in refs):
        raise argument_error("%s: q, k, v must share a float32, float16, bfloat16 or fp8_e4m3 dtype (got %s, %s, %s%s)"
                             % (func, qr.dtype, kr.dtype, vr.dtype,
                                "" if dtype == qr.dtype else "; dtype=%r" % dtype))
    fmt = _choice(format, _FORMATS, "format")
    b_ax, s_ax = (0, 1) if fmt == 0 else (1, 0)
    if kr.shape[b_ax] != qr.shape[b_ax] or kr.shape[3] != qr.shape[3]:
        raise argument_error("%s: k has shape %s, q %s: batch and head_dim must agree" % (func, kr.shape, qr.shape))
    if vr.shape[:3] != kr.shape[:3]:
        raise argument_error("%s: v has shape %s, k %s: only the head dimension may differ" % (func, vr.shape,
                                                                                             kr.shape))
    a = _lib.KernelAttnArgs(dtype=_DTYPES[dtype], format=fmt, batch=qr.shape[b_ax], num_heads=qr.shape[2],
                            num_kv_heads=kr.shape[2], head_dim=qr.shape[3], head_dim_v=vr.shape[3],
                            seq_q=qr.shape[s_ax], seq_k=kr.shape[s_ax], q_offset=_int(q_offset, "q_offset"),
                            k_offset=_int(k_offset, "k_offset"), mask=1 if causal else 0,
                            softmax_scale=_float(softmax_scale, "softmax_scale"), window=_int(window, "window"),
                            softcap=_float(softcap, "softcap"))
    a.q, a.k, a.v = qr.ptr, kr.ptr, vr.ptr
    # an FP8 call writes bfloat16
    a.o_dtype = a.grad_dtype = _DTYPES["bfloat16" if dtype == _FP8 else dtype]
    keep = None
    if rects is not None:
        keep = (_lib.AttnRect * max(len(rects), 1))(*[_lib.AttnRect(*map(int, r)) for r in rects])
        a.rects = ctypes.addressof(keep)
        a.num_rects = len(rects)
    out_shape = list(qr.shape)
    out_shape[3] = vr.shape[3]
    lse_shape = (qr.shape[b_ax], qr.shape[2], qr.shape[s_ax])
    return a, qr, kr, vr, tuple(out_shape), lse_shape, keep


def kernel_attention_forward(ctx, q, k, v, causal=True, q_offset=0, k_offset=0, softmax_scale=0.0, window=0,
                             softcap=0.0, format="bshd", rects=None, dtype=None, q_descale=None, k_descale=None,
                             v_descale=None):
    """Attention of one query block against one key/value block on one
    device (``cp_kernel_attn_forward``): returns ``(out, lse)``.

    Dense 4-d arrays in ``format``; ``q_offset`` / ``k_offset`` are the
    global positions of the first rows (the causal mask and window compare
    positions); ``rects``: optional ``(q_row, q_len, k_row, k_len, q_pos,
    k_pos)`` rectangles (then the offsets are not used). ``dtype``: the
    arrays' element type when their own does not say it (``uint8`` codes
    need ``dtype="fp8_e4m3"``). FP8 (API 1.2): out is bfloat16; the
    descales (None = 1) are numbers or arrays of 1 or of the call's
    num_heads (q) / num_kv_heads (k, v) values, as for
    :meth:`AttnPlan.forward`."""
    func = "kernel_attention_forward"
    a, qr, kr, vr, out_shape, lse_shape, keep = _kernel_args(ctx, q, k, v, causal, q_offset, k_offset, softmax_scale,
                                                             window, softcap, format, rects, func, dtype)
    descales = (q_descale, k_descale, v_descale)
    kept = []
    if any(x is not None for x in descales):
        if a.dtype != _DTYPES[_FP8]:
            raise argument_error("%s: descales are for FP8 inputs (dtype 'fp8_e4m3')" % func)
        problems = []
        kept = _descale_args(a, descales, (a.num_heads, a.num_kv_heads, a.num_kv_heads), qr, func, problems)
        if problems:
            raise argument_error(problems[0])
    out = _arrays.empty_like(qr, out_shape, "bfloat16" if a.dtype == _DTYPES[_FP8] else None)
    lse = _arrays.empty_like(qr, lse_shape, "float32")
    a.o = _arrays.view(out, "out").ptr
    a.lse = _arrays.view(lse, "lse").ptr
    check(_lib.get().cp_kernel_attn_forward(ctx._h, byref(a)))
    del keep, kept
    return out, lse


def kernel_attention_backward(ctx, q, k, v, out, lse, dout, causal=True, q_offset=0, k_offset=0, softmax_scale=0.0,
                              window=0, softcap=0.0, format="bshd", rects=None, dtype=None):
    """Gradients of one block's attention (``cp_kernel_attn_backward``):
    returns ``(dq, dk, dv)`` from the forward's ``out`` and ``lse`` and
    ``dout``; other arguments as :func:`kernel_attention_forward` (FP8 has
    no backward: ``Status.UNSUPPORTED``)."""
    func = "kernel_attention_backward"
    a, qr, kr, vr, out_shape, lse_shape, keep = _kernel_args(ctx, q, k, v, causal, q_offset, k_offset, softmax_scale,
                                                             window, softcap, format, rects, func, dtype)
    if a.dtype == _DTYPES[_FP8]:
        raise Error(Status.UNSUPPORTED, "%s: FP8 (float8_e4m3fn) attention is forward only (API 1.2)" % func)
    for name, obj, shape, dt in (("out", out, out_shape, qr.dtype), ("lse", lse, lse_shape, "float32"),
                                 ("dout", dout, out_shape, qr.dtype)):
        r = _arrays.view(obj, "%s: %s" % (func, name))
        if r.shape != tuple(shape) or r.dtype != dt or not r.contiguous:
            raise argument_error("%s: %s must be a C-contiguous %s array of shape %s" % (func, name, dt, shape))
        setattr(a, {"out": "o", "lse": "lse", "dout": "dout"}[name], r.ptr)
    dq = _arrays.empty_like(qr, qr.shape)
    dk = _arrays.empty_like(qr, kr.shape)
    dv = _arrays.empty_like(qr, vr.shape)
    a.dq, a.dk, a.dv = (_arrays.view(x, "grad").ptr for x in (dq, dk, dv))
    check(_lib.get().cp_kernel_attn_backward(ctx._h, byref(a)))
    del keep
    return dq, dk, dv


def kernel_merge(ctx, out, lse, out_part, lse_part, format="bshd"):
    """Merge a partial attention result over other keys into ``(out,
    lse)``, in place (``cp_kernel_merge``); out float32 keeps full
    precision."""
    func = "kernel_merge"
    if not isinstance(ctx, Context):
        raise argument_error("%s: ctx must be a Context" % func)
    o, l, op, lp = (_arrays.view(x, "%s: %s" % (func, n)) for x, n in ((out, "out"), (lse, "lse"),
                                                                       (out_part, "out_part"),
                                                                       (lse_part, "lse_part")))
    fmt = _choice(format, _FORMATS, "format")
    for r, n in ((o, "out"), (l, "lse"), (op, "out_part"), (lp, "lse_part")):
        if not r.contiguous:
            raise argument_error("%s: %s must be C-contiguous" % (func, n))
    if len(o.shape) != 4 or op.shape != o.shape:
        raise argument_error("%s: out and out_part must be 4-d arrays of one shape" % func)
    b_ax, s_ax = (0, 1) if fmt == 0 else (1, 0)
    lse_shape = (o.shape[b_ax], o.shape[2], o.shape[s_ax])
    if l.shape != lse_shape or lp.shape != lse_shape or l.dtype != "float32" or lp.dtype != "float32":
        raise argument_error("%s: lse and lse_part must be float32 arrays of shape %s" % (func, lse_shape))
    dt = lambda r: _DTYPES.get("bfloat16" if r.dtype == "uint16" else r.dtype, -1)  # noqa: E731
    a = _lib.KernelMergeArgs(format=fmt, batch=o.shape[b_ax], seq=o.shape[s_ax], num_heads=o.shape[2],
                             head_dim_v=o.shape[3], o_dtype=dt(o), o_part_dtype=dt(op))
    a.o, a.lse, a.o_part, a.lse_part = o.ptr, l.ptr, op.ptr, lp.ptr
    check(_lib.get().cp_kernel_merge(ctx._h, byref(a)))
    return out, lse

