# SPDX-License-Identifier: MIT
"""Arrays the package hands to C: NumPy on the CPU; PyTorch tensors, objects
with ``__cuda_array_interface__`` (CuPy, Numba) or DLPack on any device.

Private. :func:`view` turns an array into an :class:`ArrayRef` (pointer,
shape, element type, device), :func:`empty_like` allocates an output of the
same kind on the same device: NumPy for NumPy, PyTorch for PyTorch, CuPy
for CuPy. A CUDA array of any other kind (an object with only
``__cuda_array_interface__`` or only DLPack) gets CuPy outputs when CuPy
can be imported, else PyTorch ones (bfloat16 elements: PyTorch first, as
CuPy has no bfloat16), on the input's device.

bfloat16: NumPy and CuPy have no such dtype. A bf16 plan takes and returns
``uint16`` arrays (NumPy or CuPy) that hold the bits of bf16 numbers, or
``ml_dtypes.bfloat16`` arrays when the inputs are of that type (the outputs
follow the inputs); PyTorch's ``torch.bfloat16`` works as it is.

FP8 E4M3 (API 1.2): PyTorch's ``torch.float8_e4m3fn`` and
``ml_dtypes.float8_e4m3fn`` arrays as they are; ``uint8`` arrays of the
codes where the caller names the type (``dtype="fp8_e4m3"``). An FP8
forward's output is bfloat16 (``uint16`` bits for ``uint8`` inputs,
``ml_dtypes.bfloat16`` for ``ml_dtypes`` ones).

Streams: the library orders its work on the context's stream. A DLPack
producer is asked for its capsule with that stream (``__dlpack__(stream=)``),
so it orders its own pending work before it; the stream a
``__cuda_array_interface__`` names is not waited for: make such arrays on
the context's stream, or synchronise before the call.
"""

import ctypes
import importlib
import sys

import numpy as np

from . import _lib

__all__ = []

_ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "uint16": 2,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
}


class ArrayRef:
    """What C needs to know about one array (a borrowed view: keep ``obj``)."""

    __slots__ = ("obj", "ptr", "shape", "dtype", "itemsize", "device", "device_index", "kind", "contiguous",
                 "writeable", "keep")

    def __init__(self, obj, ptr, shape, dtype, device, device_index, kind, contiguous, writeable, keep=None):
        self.obj = obj
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.itemsize = _ITEMSIZE.get(dtype, 0)
        self.device = device
        self.device_index = device_index
        self.kind = kind
        self.contiguous = contiguous
        self.writeable = writeable
        self.keep = keep

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self):
        return self.size * self.itemsize

    @property
    def aligned(self):
        return self.itemsize == 0 or self.ptr % self.itemsize == 0


def _numpy_dtype_name(dt):
    name = dt.name
    if name == "bfloat16":  # ml_dtypes
        return "bfloat16"
    return name


def _c_contiguous(shape, strides, itemsize):
    """Whether byte strides describe a dense C-order array."""
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


# -- DLPack ---------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_CODES = {(2, 64): "float64", (2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16", (1, 16): "uint16",
             (0, 64): "int64", (0, 32): "int32", (1, 8): "uint8", (0, 8): "int8"}


def _dlpack_capsule(obj, stream):
    """``obj.__dlpack__()``, on a CUDA stream when one is given and the
    array is on a CUDA device (the producer then orders its pending work
    before that stream); producers that take no stream are asked without."""
    if stream:
        try:
            dev = obj.__dlpack_device__()[0]
        except Exception:  # noqa: BLE001 - any failure: ask without a stream
            dev = None
        if dev in (_DL_CUDA, _DL_CUDA_MANAGED):
            try:
                return obj.__dlpack__(stream=int(stream))
            except TypeError:
                pass
    return obj.__dlpack__()


def _view_dlpack(obj, what, stream=None):
    # The capsule is not consumed: while it is referenced (ArrayRef.keep)
    # the producer keeps the memory, and when it is collected its destructor
    # calls the deleter, as the DLPack protocol says for unconsumed capsules.
    capsule = _dlpack_capsule(obj, stream)
    addr = _capsule_get_pointer(capsule, b"dltensor")
    if not addr:
        raise _lib.argument_error("%s: its __dlpack__() did not give a DLPack tensor" % what)
    t = _DLManagedTensor.from_address(addr).dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise _lib.argument_error("%s: DLPack element type (code %d, %d bits, %d lanes) is not supported"
                                  % (what, t.dtype.code, t.dtype.bits, t.dtype.lanes))
    itemsize = _ITEMSIZE[dtype]
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    dev = t.device.device_type
    if dev in (_DL_CPU, _DL_CUDA_HOST):
        device = "cpu"
    elif dev in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = "cuda"
    else:
        raise _lib.argument_error("%s: DLPack device type %d is neither the CPU nor CUDA" % (what, dev))
    return ArrayRef(obj, (t.data or 0) + t.byte_offset, shape, dtype, device, t.device.device_id, "dlpack",
                    _c_contiguous(shape, strides, itemsize), True, keep=capsule)


# -- dispatch -------------------------------------------------------------


def _is_torch(obj):
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")


def _module_root(obj):
    return type(obj).__module__.split(".")[0]


def view(obj, what, stream=None):
    """An :class:`ArrayRef` of ``obj``; ``what`` names it in messages.
    ``stream``: the CUDA stream (an int) the array will be used on, handed
    to DLPack producers; None = the default stream."""
    if isinstance(obj, np.ndarray):
        ai = obj.__array_interface__
        return ArrayRef(obj, ai["data"][0], obj.shape, _numpy_dtype_name(obj.dtype), "cpu", 0, "numpy",
                        bool(obj.flags.c_contiguous), bool(obj.flags.writeable))
    if _is_torch(obj):
        dev = obj.device
        dtype = str(obj.dtype).replace("torch.", "")
        index = dev.index
        if dev.type == "cuda" and index is None:
            index = sys.modules["torch"].cuda.current_device()
        return ArrayRef(obj, obj.data_ptr(), tuple(obj.shape), dtype, dev.type, index or 0, "torch",
                        bool(obj.is_contiguous()), True)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        typestr = cai["typestr"]
        try:
            dt = np.dtype(typestr)
            dtype = _numpy_dtype_name(dt)
        except TypeError:
            raise _lib.argument_error("%s: element type %r is not supported" % (what, typestr)) from None
        ptr, readonly = cai["data"]
        shape = tuple(cai["shape"])
        dev = getattr(obj, "device", None)
        index = getattr(dev, "id", None)
        return ArrayRef(obj, ptr or 0, shape, dtype, "cuda", -1 if index is None else index,
                        _module_root(obj), _c_contiguous(shape, cai.get("strides"), dt.itemsize), not readonly)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _view_dlpack(obj, what, stream)
    if hasattr(obj, "__array_interface__"):
        return view(np.asarray(obj), what)
    raise _lib.argument_error("%s: expected an array (NumPy, PyTorch, CuPy, DLPack), got %s"
                              % (what, type(obj).__name__))


def _numpy_dtype(name, like=None):
    if name == "bfloat16":
        if like is not None and like.dtype.name == "bfloat16":
            return like.dtype
        ml = sys.modules.get("ml_dtypes")
        if like is not None and like.dtype.name == "float8_e4m3fn" and ml is not None:
            return np.dtype(ml.bfloat16)  # an FP8 forward's output, like its ml_dtypes inputs
        return np.dtype(np.uint16)
    if name == "float8_e4m3fn":
        if like is not None and like.dtype.name == "float8_e4m3fn":
            return like.dtype
        return np.dtype(np.uint8)
    return np.dtype(name)


def _module(name):
    """A module by name, imported if need be; None if it cannot be."""
    mod = sys.modules.get(name)
    if mod is None:
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - missing, or broken (no CUDA libraries)
            return None
    return mod


def _cupy_empty(cupy, ref, shape, name):
    index = ref.device_index
    if index < 0:  # an array that does not say its device: ask CUDA where its memory is
        index = -1
        if ref.ptr:
            try:
                index = int(cupy.cuda.runtime.pointerGetAttributes(ref.ptr).device)
            except Exception:  # noqa: BLE001 - not device memory CUDA knows
                index = -1
        if index < 0:
            index = cupy.cuda.runtime.getDevice()
    with cupy.cuda.Device(index):
        return cupy.empty(shape, dtype={"bfloat16": "uint16", "float8_e4m3fn": "uint8"}.get(name, name))


def empty_like(ref, shape, dtype=None):
    """A new uninitialised array of ``shape`` of the same kind and on the
    same device as ``ref``; ``dtype`` a name ("float32", ...) or None for
    ``ref``'s own element type.

    CUDA arrays other than PyTorch's and CuPy's get a CuPy array when CuPy
    can be imported, else a PyTorch tensor (for bfloat16, PyTorch first;
    CuPy's is a ``uint16`` array of bf16 bits)."""
    shape = tuple(int(s) for s in shape)
    if ref.kind == "torch":
        torch = sys.modules["torch"]
        dt = ref.obj.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=ref.obj.device)
    if ref.device == "cpu":
        if ref.kind == "numpy":
            dt = ref.obj.dtype if dtype is None else _numpy_dtype(dtype, ref.obj)
        else:
            dt = _numpy_dtype(dtype or ref.dtype)
        return np.empty(shape, dtype=dt)
    name = dtype or ref.dtype
    if ref.kind == "cupy":
        return _cupy_empty(sys.modules["cupy"], ref, shape, name)
    # any other CUDA array: a CuPy array or a PyTorch tensor on its device
    for lib in (("torch", "cupy") if name == "bfloat16" else ("cupy", "torch")):
        mod = _module(lib)
        if mod is None:
            continue
        if lib == "cupy":
            return _cupy_empty(mod, ref, shape, name)
        index = ref.device_index if ref.device_index >= 0 else mod.cuda.current_device()
        return mod.empty(shape, dtype=getattr(mod, name), device="cuda:%d" % index)
    raise _lib.argument_error("cannot allocate an output like a %s array on CUDA: install CuPy or PyTorch, "
                              "or pass CuPy arrays or PyTorch tensors" % ref.kind)


def float32_to_bf16_bits(x):
    """bfloat16 bits (``numpy.uint16``) of float values, rounded to nearest
    even; NaN stays NaN."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    u = a.reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a.reshape(-1))
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded.reshape(np.shape(x))


def bf16_bits_to_float32(bits):
    """float32 values of bfloat16 bits (any uint16 array, or an
    ``ml_dtypes.bfloat16`` array)."""
    b = np.asarray(bits)
    if b.dtype.name == "bfloat16":
        return b.astype(np.float32)
    if b.dtype != np.uint16:
        raise _lib.argument_error("bf16_bits_to_float32: expected uint16 bits, got %s" % b.dtype)
    return (b.astype(np.uint32).reshape(-1) << 16).view(np.float32).reshape(b.shape)


# -- FP8 E4M3 ----------------------------------------------------------------


def _fp8_e4m3_values():
    """The value of every code 0..255 (float64), from the format: 1 sign, 4
    exponent bits of bias 7, 3 mantissa bits, subnormals, S.1111.111 NaN."""
    c = np.arange(256)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    mag = np.where((e == 15) & (c & 7 == 7), np.nan, mag)
    return np.where(c & 0x80, -mag, mag)


_FP8_VALUES = _fp8_e4m3_values()


def fp8_e4m3_bits_to_float32(bits):
    """float32 values of FP8 E4M3 codes (a ``uint8`` array, or an
    ``ml_dtypes.float8_e4m3fn`` one), exactly; the NaN codes give NaN."""
    b = np.asarray(bits)
    if b.dtype.name == "float8_e4m3fn":
        return b.astype(np.float32)
    if b.dtype != np.uint8:
        raise _lib.argument_error("fp8_e4m3_bits_to_float32: expected uint8 codes, got %s" % b.dtype)
    return _FP8_VALUES[b].astype(np.float32)


def float32_to_fp8_e4m3_bits(x):
    """FP8 E4M3 codes (``numpy.uint8``) of values, rounded to nearest even.
    As PyTorch's conversion, not saturating: beyond 464 (halfway from the
    largest value 448 to the next step, which the NaN code takes) and NaN
    give the NaN code; +-0 keep their sign."""
    a = np.asarray(x, dtype=np.float64)
    mag = np.abs(a).reshape(-1)
    pos = _FP8_VALUES[:127]  # codes 0x00 .. 0x7e, increasing
    hi = np.clip(np.searchsorted(pos, mag, side="left"), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = mag - pos[lo], pos[hi] - mag
    # nearest; on a tie the even code
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(np.isnan(mag) | (mag > 464), 0x7F, code)
    code = np.where(mag == 464, 0x7E, code)
    code = code | np.where(np.signbit(a.reshape(-1)), 0x80, 0)
    return code.astype(np.uint8).reshape(np.shape(x))


def float32_vector(ref, obj, n=None):
    """``obj`` (a number or an array of any kind) as a contiguous 1-d float32
    array of ``ref``'s kind on ``ref``'s device (NumPy for CPU arrays other
    than PyTorch's); one value is repeated ``n`` times when ``n`` is given.
    For the small per-call arrays of an FP8 forward (descales)."""
    torch = sys.modules.get("torch")
    if ref.kind == "torch":
        t = obj if isinstance(obj, torch.Tensor) else torch.as_tensor(np.asarray(obj, dtype=np.float32))
        t = t.detach().to(device=ref.obj.device, dtype=torch.float32).reshape(-1)
        if n is not None and t.numel() == 1:
            t = t.expand(n)
        return t.contiguous()
    if ref.device == "cpu":
        if torch is not None and isinstance(obj, torch.Tensor):
            obj = obj.detach().cpu().numpy()
        a = np.asarray(obj, dtype=np.float32).reshape(-1)
        if n is not None and a.size == 1:
            a = np.full(n, a[0], dtype=np.float32)
        return np.ascontiguousarray(a)
    cupy = _module("cupy")
    if cupy is None:
        raise _lib.argument_error("cannot make a CUDA array for a %s array without CuPy: pass PyTorch tensors"
                                  % ref.kind)
    with cupy.cuda.Device(ref.device_index if ref.device_index >= 0 else cupy.cuda.runtime.getDevice()):
        a = cupy.asarray(obj, dtype=cupy.float32).reshape(-1)
        if n is not None and a.size == 1:
            a = cupy.full(n, a[0], dtype=cupy.float32)
        return cupy.ascontiguousarray(a)
