"""The opened checkpoint: names, metadata and extras at once; tensor bytes on demand."""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import torch

from .containers import Selection, all_tensors, select_weights
from .devices import DeviceMap, DeviceSpec
from .errors import (
    CorruptCheckpointError,
    TensorNotFoundError,
    TorchgraftError,
    brief,
    parse_errors,
    reading,
)
from .io import Contents, ReadOptions, open_contents
from .meta import TensorMeta, TensorRef, parse_dtype
from .safe_pickle import skipped_calls
from .wrappers import Wrapper, detect_wrappers

__all__ = ["Checkpoint", "OpenOptions", "open", "open_with"]

logger = logging.getLogger("torchgraft")


class Checkpoint:
    """A checkpoint opened for reading; tensors are read only when asked for.

    Use :func:`open` to create one. It works as a context manager, and as a read-only mapping
    of weight names to tensors (``ckpt[name]``, ``len(ckpt)``, ``name in ckpt``).

    Attributes:
        path: The file or directory opened.
        format: The format, e.g. ``"torch-zip"``, ``"safetensors"``, ``"dcp"``, ``"paddle"``.
        weights_key: Where the weights were found in the saved object (``""`` for the top).
        model_class: The class of a pickled whole model the weights came from, if any.
        weight_sets: Every place in the file holding weights, with its tensor count.
        extras: Everything saved besides the weights, as plain Python data.
        skipped_calls: Globals the file's pickle called (an ``Enum``, a config class) that
            were recorded, not run: nothing from the file runs unless ``unsafe=True``.
    """

    def __init__(self, contents: Contents, selection: Selection) -> None:
        self._contents = contents
        self._weights = selection.weights
        self.path = contents.path
        self.format = contents.format
        self.weights_key = selection.key
        self.model_class = selection.model_class
        self.weight_sets = selection.weight_sets
        self.extras = selection.extras

    @functools.cached_property
    def skipped_calls(self) -> list[str]:
        """Globals the file's pickle called that were recorded, not run (found when asked)."""
        return skipped_calls(self._contents.root)

    def keys(self) -> list[str]:
        """Return the names of the model weights, in stored order."""
        return list(self._weights)

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.get(name)

    def _ref(self, name: str) -> TensorRef:
        ref = self._weights.get(name)
        if ref is None:
            close = difflib.get_close_matches(name, self._weights, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise TensorNotFoundError(
                f"'{name}' is not among the {len(self._weights)} weights of this checkpoint."
                + hint, path=self.path)
        return ref

    def meta(self, name: str) -> TensorMeta:
        """Return a weight's shape, dtype, size and saved device, without reading it.

        Args:
            name: The weight's name.

        Returns:
            Its metadata.

        Raises:
            TensorNotFoundError: If there is no such weight.
        """
        return self._ref(name).meta

    def get(self, name: str, device: DeviceSpec | DeviceMap = "cpu", *,
            dtype: torch.dtype | str | None = None) -> torch.Tensor:
        """Read one weight.

        Args:
            name: The weight's name.
            device: Where to put it: ``"cpu"``, ``"cuda:0"``, a :class:`torch.device`, or a
                mapping from saved devices, e.g. ``{"cuda:1": "cuda:0"}``.
            dtype: Cast floating-point weights to this dtype; other weights are left as they are.

        Returns:
            The tensor. On the CPU it may be memory-mapped from the file (copy-on-write).

        Raises:
            TensorNotFoundError: If there is no such weight.
            DeviceError: If the device is not available.
            CorruptCheckpointError: If its bytes are missing or damaged.
        """
        ref = self._ref(name)
        devices = device if isinstance(device, DeviceMap) else DeviceMap(device)
        return _materialise(ref, name, devices, parse_dtype(dtype) if dtype else None, self.path)

    @property
    def saved_devices(self) -> set[str]:
        """Where the checkpoint's tensors lived when saved, e.g. ``{"cuda:1"}``."""
        return {ref.meta.device for ref in all_tensors(self._contents.root)}

    @property
    def wrappers(self) -> list[Wrapper]:
        """Training wrappers seen in the weight names (``module.``, ``_orig_mod.``, ``model.``).

        ``model.`` counts only inside a Lightning checkpoint: elsewhere it is a real module.
        """
        return detect_wrappers(self._weights, saved=self.saved_keys)

    @property
    def saved_keys(self) -> list[str]:
        """The top-level keys of the saved object (``epoch``, ``state_dict``...), if a dict."""
        root = self._contents.root
        return [str(k) for k in root] if isinstance(root, dict) else []

    @property
    def raw_root(self) -> Any:
        """The saved object as read: lazy tensors, inert pickled objects, plain data."""
        return self._contents.root

    def tensor_refs(self) -> dict[str, TensorRef]:
        """Return every weight as a lazy reference, in stored order (nothing is read).

        Reading one turns any failure into a :class:`TorchgraftError` naming the file and the
        key, whoever reads it (graft, convert, diff).
        """
        return {name: _Named(ref, name, self.path) for name, ref in self._weights.items()}

    def items_meta(self) -> list[tuple[str, TensorMeta]]:
        """Return every weight's name and metadata, in stored order."""
        return [(name, ref.meta) for name, ref in self._weights.items()]

    def close(self) -> None:
        """Release the files the checkpoint holds open; tensors already read stay valid."""
        self._contents.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Checkpoint {self.format} '{self.path}': {len(self)} weights>"


class _Named(TensorRef):
    """The same lazy tensor, its reads turning any failure into an error naming file and key.

    One object per key, its readers methods (see :class:`~torchgraft.meta.TensorRef`): a
    checkpoint of 100k tensors makes 100k of them on opening.
    """

    __slots__ = ("_inner", "_name", "_path")

    def __init__(self, ref: TensorRef, name: str, path: Path) -> None:
        # its readers are methods: not TensorRef.__init__ (see TensorRef)
        self.meta = ref.meta
        self.alias_key = ref.alias_key
        self.span = ref.span
        self._inner = ref
        self._name = name
        self._path = path

    def read(self) -> torch.Tensor:
        try:  # no context managers on the way in: 100k tensors read at a few us each
            return self._inner.read()
        except Exception as exc:
            _named(exc, self._name, self._path)

    def _read_into(self, out: torch.Tensor) -> None:
        try:
            self._inner.read_into(out)
        except Exception as exc:
            _named(exc, self._name, self._path)

    def _read_box(self, start: tuple[int, ...], out: torch.Tensor) -> None:
        with reading(self._path), _naming(self._name):
            self._inner.read_box(start, out)


def _named(exc: Exception, name: str, path: Path) -> NoReturn:
    """Raise a failure while reading ``name`` as :func:`reading` and :func:`_naming` turn it."""
    with reading(path), _naming(name):
        raise exc


@contextlib.contextmanager
def _naming(name: str) -> Iterator[None]:
    """Name the tensor in a failure's message."""
    try:
        yield
    except TorchgraftError as exc:
        raise exc.about(name) from exc.__cause__
    except parse_errors() as exc:
        raise CorruptCheckpointError(f"while reading '{name}': the data is malformed "
                                     f"({brief(exc)})") from exc


def _materialise(ref: TensorRef, name: str, devices: DeviceMap, dtype: torch.dtype | None,
                 path: Path) -> torch.Tensor:
    target = devices.target(ref.meta.device, name=name, path=path)
    with reading(path):
        tensor = ref.read()
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    return tensor.to(target)


@dataclass(frozen=True)
class OpenOptions:
    """How a checkpoint path is opened: the same four choices wherever a path is read.

    :func:`open`, :func:`~torchgraft.load`, :func:`~torchgraft.inspect`,
    :func:`~torchgraft.convert` and :func:`~torchgraft.graft` take them as keyword arguments
    of these names.

    Attributes:
        unsafe: Let pickles call globals outside torchgraft's allow-list. This runs code from
            the file: use it only for files you trust.
        weights_key: Where the weights are in a training checkpoint (``"state_dict_ema"``);
            found automatically when ``None``.
        component: In a folder of several models (a diffusers pipeline, a sentence-
            transformers model), open this part alone (``"unet"``); all parts when ``None``.
        follow_links: Follow links out of the checkpoint's folder. Without it a part (a
            shard, a data file, a rank file) that links out is refused, unless the link stays
            inside a recognised model store (the Hugging Face Hub cache's ``blobs``,
            git-annex or DVC objects of the same repository).
    """

    unsafe: bool = False
    weights_key: str | None = None
    component: str | None = None
    follow_links: bool = False


def open(path: str | os.PathLike[str], *, unsafe: bool = False,
         weights_key: str | None = None, component: str | None = None,
         follow_links: bool = False) -> Checkpoint:
    """Open a checkpoint of any supported format, reading only its metadata.

    Formats: torch.save zip and legacy files (state dicts, training checkpoints, whole pickled
    models whose classes need not be importable), safetensors, sharded ``*.index.json``
    checkpoints, torch.distributed.checkpoint directories, PaddlePaddle ``.pdparams`` (no paddle
    needed), NumPy ``.npy``/``.npz``, and a directory holding one checkpoint.

    Args:
        path: A checkpoint file or directory.
        unsafe: See :class:`OpenOptions` (runs code from the file: only for files you trust).
        weights_key: See :class:`OpenOptions`.
        component: See :class:`OpenOptions`.
        follow_links: See :class:`OpenOptions`.

    Returns:
        The opened checkpoint; close it, or use it in a ``with`` block.

    Raises:
        TorchgraftError: Any failure, naming the file: a subclass says which kind.
    """
    return open_with(path, OpenOptions(unsafe, weights_key, component, follow_links))


def open_with(path: str | os.PathLike[str], options: OpenOptions) -> Checkpoint:
    """Open a checkpoint as :func:`open` does, with its options as one value.

    Args:
        path: A checkpoint file or directory.
        options: How to open it.

    Returns:
        The opened checkpoint; close it, or use it in a ``with`` block.

    Raises:
        TorchgraftError: Any failure, naming the file: a subclass says which kind.
    """
    location = Path(path)
    contents = open_contents(location, ReadOptions(unsafe=options.unsafe,
                                                   component=options.component,
                                                   follow_links=options.follow_links))
    try:
        selection = select_weights(contents.root, key=options.weights_key)
    except TorchgraftError as exc:
        contents.close()
        raise exc.located(location) from None
    logger.debug("opened %s as %s: %d weights under %r", location, contents.format,
                 len(selection.weights), selection.key)
    return Checkpoint(contents, selection)


