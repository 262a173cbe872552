"""A pickle reader that never runs code from the file.

Checkpoints are pickles, and a pickle is a program: ``GLOBAL os system`` followed by ``REDUCE``
runs a shell command. This unpickler resolves globals in three ways, and never imports anything
the file names:

* **Allow-listed callables** (tensor rebuild functions, ``OrderedDict``, numpy array
  reconstruction...) resolve to torchgraft's own inert implementations in :data:`_SAFE_CALLS`.
  Tensors become lazy :class:`~torchgraft.meta.TensorRef` objects; no byte of data is read.
* **torch values** (dtypes, layouts, storage types) resolve to the values themselves.
* **Anything else** resolves to an inert stand-in class, a subclass of :class:`PickledObject`.
  A pickled object of such a class (``NEWOBJ`` + ``BUILD``, the way ``torch.save(model)``
  stores a model whose class is not importable here) becomes a record of its class name and
  state. *Calling* such a global (``REDUCE``: an ``Enum`` in Lightning hyper-parameters,
  DeepSpeed's ``ZeroStageEnum``) runs nothing either: it becomes a record of the call
  (:attr:`PickledObject.called`), listed by :func:`skipped_calls`. ``getattr`` on such a record
  (mmengine pickles ``getattr(HistoryBuffer, 'min')``) gives another record.

Only a call of a known code-execution primitive (:data:`DANGEROUS`: ``os``, ``subprocess``,
``eval``, ``__import__``, ``torch.load``...) raises
:class:`~torchgraft.errors.UnsafeCheckpointError`: such a file was made to run code.
``unsafe=True`` (trusted files only) calls the real globals instead. Resolving a name never
imports a module: torch's own values are looked up only among what torch has already loaded.
"""

from __future__ import annotations

import codecs
import collections
import datetime
import importlib
import io
import pathlib
import pickle
from collections.abc import Callable
from typing import IO, Any, Protocol

import numpy as np
import torch

from . import quantized
from .bounds import MAX_NESTING, check_fits, check_nesting, check_shape
from .errors import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    UnsupportedCheckpointError,
    reading,
    shown,
)
from .meta import TensorMeta, TensorRef, torch_dtype_of_numpy
from .pickle_walk import walk_opcodes

__all__ = [
    "DANGEROUS",
    "MAX_UNKNOWN_CALLS",
    "PickledObject",
    "StorageType",
    "TensorFactory",
    "numpy_ref",
    "safe_load",
    "skipped_calls",
]

# Module names that one Python, numpy or torch version writes and another reads under another
# name: Python 2's builtins, numpy 1 vs 2, Python 3.13's pathlib.
_MODULE_ALIASES = {
    "__builtin__": "builtins",
    "copy_reg": "copyreg",
    "numpy.core.multiarray": "numpy._core.multiarray",
    "numpy.core.numeric": "numpy._core.numeric",
    "pathlib._local": "pathlib",
}

#: Calls that run code, whole modules or single names: a pickle calling one was made to attack.
DANGEROUS: tuple[str, ...] = (
    "os.", "posix.", "nt.", "subprocess.", "sys.", "runpy.", "importlib.", "ctypes.", "socket.",
    "shutil.", "webbrowser.", "pty.", "code.", "pydoc.", "pickle.", "_pickle.", "marshal.",
    "multiprocessing.", "signal.", "asyncio.", "threading.", "_thread.", "builtins.eval",
    "builtins.exec", "builtins.compile", "builtins.open", "builtins.__import__",
    "builtins.setattr", "builtins.delattr", "builtins.globals", "builtins.locals",
    "builtins.vars", "builtins.breakpoint", "builtins.input", "builtins.exit", "builtins.quit",
    "io.", "_io.", "codecs.open", "tempfile.", "urllib.", "http.", "ftplib.", "smtplib.",
    "torch.load", "torch.serialization.load", "torch.hub.", "torch.jit.load",
    "torch.package.", "torch.ops.", "torch._ops.", "torch.utils.cpp_extension.",
    "torch._C._", "numpy.load", "numpy.lib.npyio.", "numpy.fromfile", "types.", "inspect.",
)


_DANGEROUS_MODULES = tuple(d for d in DANGEROUS if d.endswith("."))
_DANGEROUS_NAMES = frozenset(d for d in DANGEROUS if not d.endswith("."))


def is_dangerous(global_name: str) -> bool:
    """Whether a dotted global is a code-execution primitive (:data:`DANGEROUS`)."""
    return global_name in _DANGEROUS_NAMES or global_name.startswith(_DANGEROUS_MODULES)

_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128, "UntypedStorage": torch.uint8,
    "QInt8Storage": torch.qint8, "QUInt8Storage": torch.quint8, "QInt32Storage": torch.qint32,
}

# Classes whose call only records its arguments (enums used by torch's own metadata).
_INERT_CALLS = frozenset({"torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING"})


class StorageType:
    """Stands for a pickled ``torch.FloatStorage``-like type: only its dtype matters.

    Args:
        dtype: The element type of the storage.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class TensorFactory(Protocol):
    """What a format gives the unpickler so that tensors become lazy references."""

    def persistent_load(self, pid: Any) -> Any:
        """Resolve a persistent id (a storage record) found in the pickle."""

    def tensor(self, storage: Any, offset: int, size: tuple[int, ...],
               stride: tuple[int, ...], dtype: torch.dtype | None) -> TensorRef:
        """Return a lazy tensor viewing ``storage``; ``dtype`` overrides the storage's."""


#: Distinct unknown globals recorded by name; further ones share one summary record.
MAX_GLOBALS = 4096
#: Arguments kept in the record of a call; the rest are counted (:attr:`PickledObject.dropped`).
MAX_ARGS = 64
#: Records of unknown classes a pickle may create: this many, plus one per
#: :data:`BYTES_PER_RECORD` of its bytes. Calls past it share one record per global (O(1)
#: each); objects past it are refused.
MIN_RECORDS = 16_384
#: A DCP ``.metadata`` writes three records per chunk in about 120 bytes (a chunk's offsets
#: and sizes, its index, its storage): 32 reads a checkpoint of any number of chunks, and a
#: record (about 250 bytes) costs at most 8 times the bytes that made it.
BYTES_PER_RECORD = 32
#: The name every unknown global past :data:`MAX_GLOBALS` is recorded under.
MORE_GLOBALS = "torchgraft.more_globals"
#: Calls of unknown globals a pickle may make (each recorded, none run): real checkpoints make
#: a few (enums in hyper-parameters, a message hub's buffers), a few thousand at most; a
#: pickle of little else only keeps its reader busy, and is refused at the first call past
#: this, whatever its size (each call costs a few microseconds to record and show).
MAX_UNKNOWN_CALLS = 100_000


class _Budget:
    """How many records one unpickling may still create, and the calls it made."""

    def __init__(self, size: int) -> None:
        self.left = MIN_RECORDS + size // BYTES_PER_RECORD
        self.summarised = 0
        self.calls = 0

    def call(self, what: str, path: str | None) -> None:
        """Count one call of an unknown global; refuse past :data:`MAX_UNKNOWN_CALLS`."""
        self.calls += 1
        if self.calls > MAX_UNKNOWN_CALLS:
            raise CorruptCheckpointError(
                f"the pickle makes more than {MAX_UNKNOWN_CALLS:,} calls of globals torchgraft "
                f"does not know (call {self.calls:,}: {shown(what, 80)}): more than any "
                "checkpoint makes, refused (they are recorded, never run; a pickle of little "
                "else only keeps its reader busy). A file you trust reads with unsafe=True "
                "(CLI: --unsafe), which runs them", path=path)

    def take(self, what: str, path: str | None) -> None:
        """Count one record; refuse past the budget."""
        if self.left <= 0:
            raise CorruptCheckpointError(
                f"the pickle builds more objects of unknown classes ({what}...) than a pickle "
                "of its size can describe: refused", path=path)
        self.left -= 1


class _InertMeta(type):
    """Metaclass of stand-in classes: calling one is refused, building one is inert."""

    _tg_global: str
    _tg_unsafe: bool
    _tg_path: str | None
    _tg_dangerous: bool
    _tg_budget: _Budget
    _tg_shared: Any

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._tg_global in _INERT_CALLS:
            return _instance(cls, args)
        if not cls._tg_unsafe:
            if cls._tg_dangerous:
                raise UnsafeCheckpointError(_display(cls._tg_global), path=cls._tg_path)
            budget = cls._tg_budget
            budget.call(cls._tg_global, cls._tg_path)
            shared = cls._tg_shared
            if shared is not None:  # the budget is spent: O(1) per call from here on
                budget.summarised += 1
                return shared
            if budget.left <= 0:  # one shared record per global from here on
                budget.summarised += 1
                shared = object.__new__(cls)  # type: ignore[arg-type]
                shared.__init_record__((), True)
                cls._tg_shared = shared
                return shared
            record = _instance(cls, args)
            record.called = True
            return record
        module, _, name = cls._tg_global.rpartition(".")
        try:
            target: Any = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError):
            return _instance(cls, args)
        return target(*args, **kwargs)


def _nesting(args: tuple[Any, ...], path: str | None) -> int:
    """How deep a record of a call with ``args`` nests, refused past the shared bound.

    A call's arguments are built before it, so a pickle nests calls of unknown globals
    (``f(f(f(...)))``) with no recursion: each record's depth is counted as it is made (from
    the arguments it keeps, :data:`MAX_ARGS`), and the whole tree is bounded once unpickled.
    """
    depth = 0
    for arg in args[:MAX_ARGS]:
        if isinstance(arg, PickledObject) and arg.depth > depth:
            depth = arg.depth
    if depth >= MAX_NESTING:
        check_nesting(depth + 1, what="the pickle's calls of unknown globals", path=path)
    return depth + 1


def _instance(cls: Any, args: tuple[Any, ...]) -> Any:
    """An inert record of ``cls``, as NEWOBJ makes it: no code of the real class runs."""
    return cls.__new__(cls, *args)


_NO_BUDGET = _Budget(1 << 62)


class PickledObject(metaclass=_InertMeta):
    """An object from a pickle whose class was not imported: its class name and its state.

    Attributes:
        global_name: The dotted name of its class, e.g. ``"mymodels.resnet.ResNet"``.
        called: True when the pickle called the global (``Color(1)``) rather than building an
            object of it; nothing was run.
        args: The arguments the pickle gave to create it.
        state: What the pickle gave to ``__setstate__`` (usually the instance ``__dict__``).
        items: Entries set on it as a mapping (dict subclasses).
        list_items: Entries appended to it (list subclasses).
        dropped: Arguments past :data:`MAX_ARGS`, counted, not kept.
        depth: How deeply records nest in its arguments (1: none).
    """

    __slots__ = ("args", "called", "depth", "dropped", "items", "list_items", "state")
    _tg_global = "builtins.object"
    _tg_unsafe = False
    _tg_path: str | None = None
    _tg_dangerous = False
    _tg_budget = _NO_BUDGET
    _tg_shared: Any = None

    def __new__(cls, *args: Any) -> PickledObject:
        """Create an empty record; nothing of the real class runs."""
        cls._tg_budget.take(cls._tg_global, cls._tg_path)
        obj = object.__new__(cls)
        obj.__init_record__(args, False)
        return obj

    def __init_record__(self, args: tuple[Any, ...], called: bool) -> None:
        """Fill an empty record (the first :data:`MAX_ARGS` arguments kept)."""
        self.depth = _nesting(args, type(self)._tg_path)
        self.args = args[:MAX_ARGS]
        self.dropped = len(args) - len(self.args)
        self.called = called
        self.state = None
        self.items = {}
        self.list_items = []

    args: tuple[Any, ...]
    called: bool
    depth: int
    dropped: int
    state: Any
    items: dict[Any, Any]
    list_items: list[Any]

    @property
    def global_name(self) -> str:
        """The dotted name of the object's class."""
        return type(self)._tg_global

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        """Record an appended item."""
        self.list_items.append(value)

    def extend(self, values: Any) -> None:
        """Record appended items."""
        self.list_items.extend(values)

    def attributes(self) -> dict[str, Any]:
        """Return the instance attributes recorded in its state.

        Returns:
            ``state`` when it is a dict; for ``(dict, slots)`` states, both merged.
        """
        state = self.state
        if isinstance(state, dict):
            return state
        if isinstance(state, tuple) and len(state) == 2:
            merged: dict[str, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return {}

    def __repr__(self) -> str:
        return f"<pickled {self.global_name}>"


def skipped_calls(root: Any, *, limit: int = 100_000) -> list[str]:
    """The globals a loaded pickle called that were recorded instead of run, once each.

    Args:
        root: What :func:`safe_load` returned (walked iteratively, each object once).
        limit: At most this many objects are visited.

    Returns:
        Dotted names, sorted.
    """
    found: dict[str, None] = {}
    stack, seen = [root], set[int]()
    while stack and len(seen) < limit:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(node)
        elif isinstance(node, PickledObject):
            if node.called:
                found.setdefault(node.global_name)
            stack.extend([node.state, *node.args, *node.items.values(), *node.list_items])
    return sorted(found)


def _display(global_name: str) -> str:
    module, _, name = global_name.rpartition(".")
    if module in ("posix", "nt"):
        return f"{global_name} (os.{name})"
    return global_name


# --- inert implementations of allow-listed callables -------------------------------------------


def _encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode``, as protocol 2 pickles store bytes: text codecs only."""
    try:
        name = codecs.lookup(encoding).name
    except (LookupError, TypeError):
        raise CorruptCheckpointError(f"_codecs.encode with unknown encoding {shown(encoding, 40)}"
                                     ) from None
    if name not in ("latin-1", "iso8859-1", "utf-8", "ascii"):
        raise UnsafeCheckpointError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode(encoding)


def _bytes_arg(value: Any = b"", encoding: str = "latin-1") -> bytes:
    """``bytes(...)``/``bytearray(...)`` from text or bytes only: ``bytes(10**12)`` is refused."""
    if isinstance(value, str):
        return _encode(value, encoding)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise CorruptCheckpointError(f"bytes built from {type(value).__name__}")


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """``copyreg._reconstructor``: protocol 0/1's way to create a plain object."""
    if isinstance(cls, type) and issubclass(cls, PickledObject):
        return cls.__new__(cls)
    if cls is collections.OrderedDict or cls is dict:
        return cls()
    raise UnsafeCheckpointError(f"copyreg._reconstructor of {cls!r}")


def _newobj(cls: Any, *args: Any) -> Any:
    """``copyreg.__newobj__`` as a callable."""
    if isinstance(cls, type) and issubclass(cls, PickledObject):
        return cls.__new__(cls, *args)
    raise UnsafeCheckpointError(f"copyreg.__newobj__ of {cls!r}")


def _path(*parts: str) -> str:
    """``pathlib.PosixPath(...)`` and friends: kept as a plain string."""
    return str(pathlib.PurePath(*parts))


class _NumpyDType:
    """``numpy.dtype(code, align, copy)`` followed by ``BUILD``: a plain dtype, no objects."""

    def __init__(self, code: Any, align: bool = False, copy: bool = True) -> None:
        if not isinstance(code, str):
            raise CorruptCheckpointError(f"numpy dtype code {code!r} is not a string")
        try:
            self.dtype = np.dtype(code)
        except (TypeError, ValueError):
            raise CorruptCheckpointError(f"numpy dtype code {shown(code, 40)} is unknown") from None
        if self.dtype.hasobject:
            raise UnsupportedCheckpointError("numpy arrays of Python objects are not read")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) < 2:
            raise CorruptCheckpointError(f"numpy dtype state {state!r} is malformed")
        if len(state) > 3 and state[3] is not None:
            raise UnsupportedCheckpointError("structured numpy arrays are not read")
        if state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


class _NumpyArray:
    """``numpy._core.multiarray._reconstruct`` followed by ``BUILD``: the array's raw bytes."""

    def __init__(self, cls: Any = None, shape: Any = None, code: Any = None) -> None:
        self.array: np.ndarray[Any, Any] | None = None

    def __setstate__(self, state: Any) -> None:
        try:
            _version, shape, dtype, fortran, raw = state
        except (TypeError, ValueError):
            raise CorruptCheckpointError("numpy array state is malformed") from None
        self.set(raw, dtype, shape, fortran=bool(fortran))

    def set(self, raw: Any, dtype: Any, shape: Any, *, fortran: bool) -> None:
        """Build the array from its raw bytes, checking their size."""
        if not isinstance(dtype, _NumpyDType):
            raise CorruptCheckpointError("numpy array without a plain dtype")
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        if not isinstance(raw, (bytes, bytearray)):
            raise UnsupportedCheckpointError("numpy arrays of Python objects are not read")
        shape = check_shape(shape, what="a numpy array")
        expected = check_fits(shape, dtype.dtype.itemsize, available=len(raw),
                              what=f"a numpy array of dtype {dtype.dtype}")
        if len(raw) != expected:
            raise CorruptCheckpointError(
                f"numpy array of shape {shape} and dtype {dtype.dtype} needs {expected} bytes, "
                f"the pickle holds {len(raw)}")
        flat = np.frombuffer(bytes(raw), dtype=dtype.dtype)
        self.array = flat.reshape(shape, order="F" if fortran else "C")


class _NumpyArrayClass:
    """``numpy.ndarray``, the class ``_reconstruct`` is given: never called by numpy's pickles.

    Calling it (``numpy.ndarray((2**33,))``) would reserve what the file claims: refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise CorruptCheckpointError("the pickle calls numpy.ndarray directly, which no numpy "
                                     "pickle does (it would reserve memory the file claims)")


def _numpy_frombuffer(raw: Any, dtype: Any, shape: Any, order: Any) -> _NumpyArray:
    """``numpy._core.numeric._frombuffer``: how pickle protocol 5 stores arrays."""
    array = _NumpyArray()
    array.set(raw, dtype, shape, fortran=order == "F")
    return array


def _numpy_scalar(dtype: Any, raw: Any = b"") -> Any:
    if not isinstance(dtype, _NumpyDType):
        raise CorruptCheckpointError("numpy scalar without a plain dtype")
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    if not isinstance(raw, bytes) or len(raw) != dtype.dtype.itemsize:
        raise CorruptCheckpointError("numpy scalar bytes are malformed")
    return np.frombuffer(raw, dtype=dtype.dtype)[0].item()


def numpy_ref(array: np.ndarray[Any, Any]) -> TensorRef | None:
    """Wrap a numpy array as a lazy tensor; ``None`` if torch has no such dtype.

    Args:
        array: The array (any byte order or memory layout).

    Returns:
        A reference whose ``read`` returns a fresh, writable tensor.
    """
    dtype = torch_dtype_of_numpy(array.dtype)
    if dtype is None:
        return None

    def read() -> torch.Tensor:
        return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), order="C"))

    return TensorRef(TensorMeta.of(array.shape, dtype), read)


def _unsupported(what: str) -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise UnsupportedCheckpointError(f"{what} are not read yet; save them as dense tensors")
    return refuse


class _Rebuilders:
    """The tensor rebuild functions, bound to the format's :class:`TensorFactory`."""

    def __init__(self, factory: TensorFactory | None) -> None:
        self.factory = factory

    def _make(self, storage: Any, offset: Any, size: Any, stride: Any,
              dtype: torch.dtype | None = None) -> TensorRef:
        if self.factory is None or not isinstance(size, tuple) or not isinstance(stride, tuple):
            raise CorruptCheckpointError("a tensor record without a storage or shape")
        return self.factory.tensor(storage, int(offset), tuple(int(s) for s in size),
                                   tuple(int(s) for s in stride), dtype)

    def tensor(self, storage: Any, offset: Any, size: Any, stride: Any) -> TensorRef:
        return self._make(storage, offset, size, stride)

    def tensor_v2(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                  hooks: Any, metadata: Any = None) -> TensorRef:
        return self._make(storage, offset, size, stride)

    def tensor_v3(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                  hooks: Any, dtype: Any, metadata: Any = None) -> TensorRef:
        if not isinstance(dtype, torch.dtype):
            raise CorruptCheckpointError(f"tensor record with dtype {dtype!r}")
        return self._make(storage, offset, size, stride, dtype)

    def qtensor(self, storage: Any, offset: Any, size: Any, stride: Any, quantizer: Any,
                requires_grad: Any = False, hooks: Any = None) -> TensorRef:
        """A quantized tensor: its integer values, read lazily, and its quantizer."""
        dtype = getattr(storage, "dtype", None)
        if dtype not in quantized.INT_REPR:
            raise CorruptCheckpointError(
                f"quantized tensor record with storage {shown(storage, 60)}")
        values = self._make(storage, offset, size, stride, quantized.INT_REPR[dtype])
        return quantized.quantized_ref(values, dtype, quantizer)

    @staticmethod
    def parameter(data: Any, requires_grad: Any = False, hooks: Any = None,
                  state: Any = None) -> Any:
        return data

    @staticmethod
    def from_type(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
        if not callable(func) or not isinstance(args, tuple):
            raise CorruptCheckpointError("malformed tensor subclass record")
        return func(*args)

    @staticmethod
    def from_numpy(data: Any, dtype: Any, device: Any, requires_grad: Any = False) -> Any:
        if not isinstance(data, _NumpyArray) or data.array is None:
            raise CorruptCheckpointError("device tensor record without a numpy array")
        return numpy_ref(data.array)

    @staticmethod
    def meta_tensor(dtype: Any, size: Any, stride: Any, requires_grad: Any = False) -> TensorRef:
        meta = TensorMeta.of(tuple(size), dtype, device="meta")

        def read() -> torch.Tensor:
            raise UnsupportedCheckpointError(
                "this tensor was saved on the 'meta' device and has no data")
        return TensorRef(meta, read)

    def calls(self) -> dict[str, Callable[..., Any]]:
        """The allow-list: dotted global name to the inert implementation."""
        return {
            "torch._utils._rebuild_tensor": self.tensor,
            "torch._utils._rebuild_tensor_v2": self.tensor_v2,
            "torch._utils._rebuild_tensor_v3": self.tensor_v3,
            "torch._utils._rebuild_parameter": self.parameter,
            "torch._utils._rebuild_parameter_with_state": self.parameter,
            "torch._tensor._rebuild_from_type": self.from_type,
            "torch._tensor._rebuild_from_type_v2": self.from_type,
            "torch._utils._rebuild_device_tensor_from_numpy": self.from_numpy,
            "torch._utils._rebuild_meta_tensor_no_storage": self.meta_tensor,
            "torch._utils._rebuild_qtensor": self.qtensor,
            "torch._utils._rebuild_sparse_tensor": _unsupported("sparse tensors"),
            "torch._utils._rebuild_sparse_csr_tensor": _unsupported("sparse tensors"),
            "torch._utils._rebuild_nested_tensor": _unsupported("nested tensors"),
            "torch._utils._rebuild_wrapper_subclass": _unsupported("tensor subclasses"),
            "torch.Size": torch.Size,
            "torch.device": torch.device,
            "torch.serialization._get_layout": _get_layout,
        }


def _get_layout(name: str) -> torch.layout:
    layout = vars(torch).get(str(name).removeprefix("torch."))  # never a lazy submodule import
    if not isinstance(layout, torch.layout):
        raise CorruptCheckpointError(f"unknown tensor layout {name!r}")
    return layout


_SAFE_CALLS: dict[str, Any] = {
    "collections.OrderedDict": collections.OrderedDict,
    "builtins.dict": dict, "builtins.list": list, "builtins.tuple": tuple,
    "builtins.set": set, "builtins.frozenset": frozenset, "builtins.complex": complex,
    "builtins.slice": slice, "builtins.bytearray": lambda *a: bytearray(_bytes_arg(*a)),
    "builtins.bytes": lambda *a: _bytes_arg(*a), "builtins.int": int, "builtins.float": float,
    "builtins.str": str, "builtins.bool": bool, "builtins.object": object,
    "_codecs.encode": _encode,
    "copyreg._reconstructor": _reconstructor,
    "copyreg.__newobj__": _newobj,
    "datetime.datetime": datetime.datetime, "datetime.date": datetime.date,
    "datetime.time": datetime.time, "datetime.timedelta": datetime.timedelta,
    "datetime.timezone": datetime.timezone,
    "pathlib.Path": _path, "pathlib.PosixPath": _path, "pathlib.WindowsPath": _path,
    "pathlib.PurePath": _path, "pathlib.PurePosixPath": _path,
    "pathlib.PureWindowsPath": _path,
    "numpy._core.multiarray._reconstruct": _NumpyArray,
    "numpy._core.multiarray.scalar": _numpy_scalar,
    "numpy._core.numeric._frombuffer": _numpy_frombuffer,
    "numpy.dtype": _NumpyDType,
    "numpy.ndarray": _NumpyArrayClass,
    # TorchScript archives (torch.jit.save) wrap lists and typed values in these.
    "torch.jit._pickle.build_intlist": list, "torch.jit._pickle.build_tensorlist": list,
    "torch.jit._pickle.build_doublelist": list, "torch.jit._pickle.build_boollist": list,
    "torch.jit._pickle.restore_type_tag": lambda value, _type_str=None: value,
}


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, *, path: str | None, unsafe: bool,
                 factory: TensorFactory | None, budget: _Budget) -> None:
        super().__init__(file)
        self._path = path
        self._unsafe = unsafe
        self._factory = factory
        self._calls = {**_SAFE_CALLS, **_Rebuilders(factory).calls(),
                       "builtins.getattr": self._getattr}
        self._stubs: dict[str, Any] = {}
        self._budget = budget

    def _getattr(self, obj: Any, name: Any, *default: Any) -> Any:
        """``getattr`` on a record of an unknown class gives a record; on anything else, no."""
        owner = obj if isinstance(obj, type) else type(obj)
        if isinstance(owner, _InertMeta) and isinstance(name, str) and not self._unsafe:
            return self._stub(f"{owner._tg_global}.{name}")
        if self._unsafe:
            return getattr(obj, name, *default)
        raise UnsafeCheckpointError(f"builtins.getattr on {type(obj).__name__}", path=self._path)

    def find_class(self, module: str, name: str) -> Any:
        module = _MODULE_ALIASES.get(module, module)
        dotted = f"{module}.{name}"
        if dotted in self._calls:
            return self._calls[dotted]
        if module in ("torch", "torch.storage"):
            if name in _STORAGE_DTYPES:
                return StorageType(_STORAGE_DTYPES[name])
            value = vars(torch).get(name)  # never a lazy submodule import
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, torch.qscheme)):
                return value
        return self._stub(dotted)

    def _stub(self, dotted: str) -> Any:
        if dotted not in self._stubs:
            dangerous = is_dangerous(dotted)
            if len(self._stubs) >= MAX_GLOBALS and not dangerous and not self._unsafe:
                dotted = MORE_GLOBALS
                if dotted in self._stubs:
                    return self._stubs[dotted]
            self._stubs[dotted] = _InertMeta(
                dotted.rpartition(".")[2] or dotted, (PickledObject,),
                {"__slots__": (), "_tg_global": dotted, "_tg_unsafe": self._unsafe,
                 "_tg_path": self._path, "_tg_dangerous": dangerous,
                 "_tg_budget": self._budget, "_tg_shared": None},
            )
        return self._stubs[dotted]

    def persistent_load(self, pid: Any) -> Any:
        if self._factory is None:
            raise CorruptCheckpointError("the pickle refers to external storage it does not hold")
        return self._factory.persistent_load(pid)


class _Finish:
    """One walk of an unpickled tree: numpy records become lazy tensors; nesting is bounded.

    Unpickling builds nested containers and calls without recursion, so a pickle can nest
    100,000 deep in a few hundred kilobytes. Here every path from the top, shared objects
    included (the height of each object is kept), is bounded by
    :data:`~torchgraft.bounds.MAX_NESTING`, so no later walk of the tree recurses deeper.
    """

    def __init__(self) -> None:
        self.seen: dict[int, Any] = {}
        self.heights: dict[int, int] = {}

    def __call__(self, obj: Any, depth: int = 1) -> Any:
        key = id(obj)
        if key in self.seen:
            return self.seen[key]
        if isinstance(obj, _NumpyArray):
            array = obj.array
            if array is None:
                raise CorruptCheckpointError("a numpy array record without data")
            ref = numpy_ref(array)
            self.seen[key] = ref if ref is not None else array.tolist()
            return self.seen[key]
        if isinstance(obj, _NumpyDType):
            return str(obj.dtype)
        if not isinstance(obj, (dict, list, PickledObject)) and type(obj) is not tuple:
            return obj
        check_nesting(depth, what="the pickle's containers and calls")
        tallest = 0

        def child(value: Any) -> Any:
            nonlocal tallest
            out = self(value, depth + 1)
            tallest = max(tallest, self.heights.get(id(value), 0))
            return out

        if isinstance(obj, dict):
            self.seen[key] = obj
            for k in list(obj):
                obj[k] = child(obj[k])
        elif isinstance(obj, list):
            self.seen[key] = obj
            obj[:] = [child(v) for v in obj]
        elif isinstance(obj, tuple):
            self.seen[key] = tuple(child(v) for v in obj)
        else:
            self.seen[key] = obj
            obj.state = child(obj.state)
            obj.args = tuple(child(v) for v in obj.args)
            for k in list(obj.items):
                obj.items[k] = child(obj.items[k])
            obj.list_items[:] = [child(v) for v in obj.list_items]
        self.heights[key] = tallest + 1
        check_nesting(tallest + 1, what="the pickle's containers and calls")
        return self.seen[key]


def safe_load(file: IO[bytes] | bytes, *, path: str | None = None, unsafe: bool = False,
              factory: TensorFactory | None = None) -> Any:
    """Unpickle one object without running code from it.

    Args:
        file: A binary file positioned at the pickle, or the pickle's bytes.
        path: The file's path, named in errors.
        unsafe: Call globals outside the allow-list (runs code from the file: trusted files only).
        factory: Turns storage records into lazy tensors; ``None`` for pickles without tensors.

    Returns:
        The object, with tensors and numpy arrays as :class:`~torchgraft.meta.TensorRef`,
        unknown classes as :class:`PickledObject`.

    Raises:
        UnsafeCheckpointError: If the pickle calls a global outside the allow-list.
        CorruptCheckpointError: If the pickle is truncated or malformed.
    """
    raw = io.BytesIO(file) if isinstance(file, bytes) else file
    with reading(path or "<pickle>"):
        start = raw.tell()
        end = raw.seek(0, io.SEEK_END)
        raw.seek(start)
        # A pickle that ends the file within _IN_MEMORY bytes is walked and unpickled from
        # memory (C reads); a larger rest of a file (a legacy torch file's storages follow its
        # pickles) through a stream cut at the file's end. Either way no read passes the end.
        stream: IO[bytes] | _Bounded = (io.BytesIO(raw.read(end - start))
                                        if end - start <= _IN_MEMORY else _Bounded(raw, end))
        base = start if isinstance(stream, io.BytesIO) else 0
        walk_opcodes(stream, end - base)
        stream.seek(start - base)
        unpickler = _SafeUnpickler(stream, path=path, unsafe=unsafe, factory=factory,
                                   budget=_Budget(end - start))
        try:
            obj = unpickler.load()
        except _MACHINE_ERRORS as exc:
            if not _raised_by_the_machine(exc):
                raise
            raise CorruptCheckpointError(f"the pickle is malformed ({type(exc).__name__}: "
                                         f"{exc})") from exc
        raw.seek(base + stream.tell())  # the caller reads on from the pickle's end
        return _Finish()(obj)


#: The most bytes from a pickle's start to its file's end that are read into memory at once.
_IN_MEMORY = 64 << 20


#: What the unpickler raises on opcodes that do not fit together (``REDUCE`` with arguments
#: that are not a tuple, ``APPEND`` to a number...), besides ``UnpicklingError``.
_MACHINE_ERRORS = (TypeError, AttributeError, KeyError, IndexError)


def _raised_by_the_machine(exc: BaseException) -> bool:
    """Whether ``exc`` came from the unpickler's C code: bad bytes, not a bug.

    That is the unpickler itself, or a call it made that never entered Python code (a
    builtin, or a callable given the wrong arguments). An error raised inside one of
    torchgraft's Python implementations has a frame of its own below :func:`safe_load`'s:
    that is a bug, and propagates.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is safe_load.__code__


class _Bounded:
    """A stream that never reads past ``end``.

    A length in a pickle (``BINUNICODE`` of 4 GiB, ``BINBYTES8`` of 2^62, a ``FRAME`` of
    2^40) makes the unpickler ask its file for that many bytes at once, and a buffered file
    reserves them before reading; here every read is cut to what the file still holds, so a
    lying length costs nothing and ends as "truncated".
    """

    def __init__(self, raw: IO[bytes], end: int) -> None:
        self.raw = raw
        self.end = end
        self.position = raw.tell()

    def _cut(self, n: int | None) -> int:
        left = self.end - self.position
        return left if n is None or n < 0 or n > left else n

    def read(self, n: int | None = -1) -> bytes:
        data = self.raw.read(self._cut(n))
        self.position += len(data)
        return data

    def readline(self, n: int | None = -1) -> bytes:
        data = self.raw.readline(self._cut(n))
        self.position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self.position

    def seek(self, position: int) -> None:
        self.position = self.raw.seek(position)
