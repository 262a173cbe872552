"""The exception hierarchy: every error torchgraft raises is a :class:`TorchgraftError`."""

from __future__ import annotations

import importlib.metadata
import itertools
import reprlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "MAX_QUOTED",
    "DeviceError",
    "MissingDependencyError",
    "OutsideCheckpointError",
    "TensorNotFoundError",
    "TorchgraftError",
    "TorchgraftWarning",
    "UnknownFormatError",
    "UnsafeCheckpointError",
    "UnsupportedCheckpointError",
    "UnsupportedModelError",
    "brief",
    "parse_errors",
    "reading",
    "shown",
]

#: The most characters of a parser's message quoted in an error (it may quote the file).
MAX_QUOTED = 160


class TorchgraftError(Exception):
    """Base class of every error torchgraft raises.

    Args:
        message: What went wrong and how to fix it.
        path: The file or directory concerned, if any; it is named first in the message.
    """

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)

    def located(self, path: str | Path) -> TorchgraftError:
        """Name ``path`` in the message if no file is named yet.

        Args:
            path: The file being read when the error happened.

        Returns:
            This error.
        """
        if self.path is None:
            self.path = str(path)
            self.args = (f"{self.path}: {self.message}",)
        return self

    def about(self, key: str) -> TorchgraftError:
        """Name the tensor ``key`` in the message if it is not named yet.

        Args:
            key: The tensor being read when the error happened.

        Returns:
            This error.
        """
        if f"'{key}'" not in self.message:
            self.message = f"while reading '{key}': {self.message}"
            self.args = (f"{self.path}: {self.message}" if self.path else self.message,)
        return self


class CheckpointNotFoundError(TorchgraftError):
    """The path does not exist, or a directory holds no checkpoint."""


class CheckpointWriteError(TorchgraftError):
    """A checkpoint could not be written (full disk, read-only folder, no permission...).

    The destination is named; an existing checkpoint there is left as it was.
    """


class UnknownFormatError(TorchgraftError):
    """The file is not in any format torchgraft reads."""


class CorruptCheckpointError(TorchgraftError):
    """The file claims a known format but its contents are broken or truncated."""


class OutsideCheckpointError(CorruptCheckpointError):
    """A part the checkpoint names (a shard, a data file, a rank file) lies outside its folder.

    An absolute name, a ``..`` leading out, or a link out of the folder that does not lead into
    a recognised model store (the Hugging Face Hub cache's blobs): refused unless the caller
    passes ``follow_links=True`` (CLI: ``--follow-links``).
    """


class UnsupportedCheckpointError(TorchgraftError):
    """The file is valid but holds something torchgraft does not read yet."""


class UnsupportedModelError(TorchgraftError):
    """The model holds something torchgraft cannot fill: a problem of the model, not the file.

    For example a parameter that is a tensor subclass other than a DTensor, or a DTensor
    placed ``Partial``.
    """


class UnsafeCheckpointError(TorchgraftError):
    """Reading the file would execute code that is not on the allow-list.

    A call of a code-execution primitive (``os.system``, ``eval``, ``subprocess.Popen``...:
    :data:`torchgraft.safe_pickle.DANGEROUS`) is what an attack looks like: the message names
    what the file would run and says so. No refusal offers ``unsafe=True``: it would run what
    was refused. (Calls of ordinary constructors are never refused: they are recorded, not
    run, and listed in ``ckpt.skipped_calls``; ``unsafe=True`` runs those, for a file you
    trust.)

    Args:
        global_name: The dotted name of the refused global, e.g. ``"posix.system"`` (kept as
            :attr:`global_name` with the name users know beside it: ``"posix.system
            (os.system)"``).
        path: The file that asked for it.
        call: The arguments the file passes to it, where it calls it: the message shows them
            (bounded, escaped), so that it says what the file would run.
    """

    def __init__(self, global_name: str, *, path: str | Path | None = None,
                 call: tuple[Any, ...] | None = None) -> None:
        module, _, name = global_name.rpartition(".")
        known = f"os.{name}" if module in ("posix", "nt") else global_name
        self.global_name = global_name if known == global_name else f"{global_name} ({known})"
        also = f" ({global_name})" if known != global_name else ""
        if call is None:
            what = f"would call {known}{also} while it is read"
        else:
            arguments = ", ".join(shown(a, 120) for a in call[:4])
            more = ", ..." if len(call) > 4 else ""
            what = f"would run {known}({arguments}{more}){also} while it is read"
        super().__init__(f"refused: the file {what}. No checkpoint needs that: the file looks "
                         "made to attack whoever opens it. Nothing was run; get the checkpoint "
                         "from a source you trust", path=path)


class TorchgraftWarning(UserWarning):
    """What a user must see without asking: a graft that is not ok, arguments understood swapped.

    Emitted through :func:`warnings.warn`, so Python shows it once per place in your code by
    default, and ``warnings.simplefilter("ignore", torchgraft.TorchgraftWarning)`` (or ``-W``)
    silences it, ``"error"`` raises it. The command line, which prints the report, does not
    show it again.
    """


class TensorNotFoundError(TorchgraftError, KeyError):
    """A tensor name that is not in the checkpoint.

    It is also a :class:`KeyError`, so ``ckpt[name]`` behaves like a mapping.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DeviceError(TorchgraftError):
    """A requested device does not exist here, or a device mapping is incomplete."""


class MissingDependencyError(TorchgraftError):
    """An optional dependency is needed for this feature.

    Args:
        package: The module that failed to import.
        extra: The torchgraft extra that installs it.
        feature: What needed it.
    """

    def __init__(self, package: str, *, extra: str, feature: str) -> None:
        self.package = package
        self.extra = extra
        wanted = " ".join(f"'{r}'" for r in _extra_requirements(extra)) or package
        super().__init__(f"{feature} needs '{package}', which is not installed. Install it "
                         f"with: pip install {wanted} (or, in torchgraft's checkout: "
                         f"bash scripts/setup.sh {extra})")


def _extra_requirements(extra: str) -> list[str]:
    """The packages an extra of torchgraft's installs, from the installed metadata."""
    try:
        requires = importlib.metadata.requires("torchgraft") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [r.split(";")[0].strip() for r in requires
            if f'extra == "{extra}"' in r.replace("'", '"')]


def brief(exc: BaseException) -> str:
    """A parser's exception as ``Type: message``, cut to :data:`MAX_QUOTED` characters.

    A parser's message may quote what it read (numpy quotes a whole header): an error never
    renders more of the file than this.

    Args:
        exc: The exception.

    Returns:
        Its class name and the start of its message.
    """
    text = str(exc)
    cut = text[:MAX_QUOTED] + ("..." if len(text) > MAX_QUOTED else "")
    return f"{type(exc).__name__}: {cut}"


class _Shown(reprlib.Repr):
    """A repr that visits a bounded part of a value (a few items per level, a few levels)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 3, limit, limit, 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 6

    def repr1(self, x: object, level: int) -> str:
        """Containers by kind (subclasses too), huge integers by size, text and bytes cut."""
        if isinstance(x, bool) or x is None:
            return repr(x)
        if isinstance(x, int):  # a 10^6-digit integer: its repr alone would raise or take time
            return repr(int(x)) if x.bit_length() <= 128 else f"<{x.bit_length()}-bit integer>"
        for kind in (str, dict, list, tuple, set, frozenset):
            if isinstance(x, kind):  # subclasses too (torch.Size, OrderedDict)
                return str(getattr(self, f"repr_{kind.__name__}")(x, level))
        if isinstance(x, (bytes, bytearray)):
            head = repr(bytes(x[:self.maxstring]))
            return head + ("..." if len(x) > self.maxstring else "")
        return super().repr1(x, level)

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        """Items in their order (reprlib sorts them: all of them, to show six)."""
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                  for k, v in itertools.islice(x.items(), self.maxdict)]
        return "{" + ", ".join(pieces + (["..."] if len(x) > self.maxdict else [])) + "}"


def shown(value: object, limit: int = 80) -> str:
    """A value from a file as an error shows it: at most ``limit`` characters, computed so.

    A precision after ``!r`` in an f-string cuts the repr after rendering all of the value:
    a YAML alias bomb or a
    pickle's shared lists nested 40 deep are 10^12 items to render. This visits at most six
    items of each container, three levels deep, and cuts strings before quoting them.

    Args:
        value: Anything read from a file or given by a user.
        limit: The most characters shown.

    Returns:
        Its repr, or the start of it followed by ``...``.
    """
    text = _Shown(limit).repr(value)
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def parse_errors() -> tuple[type[BaseException], ...]:
    """What a parser raises when the bytes it is given are bad (and nothing else).

    ``ValueError`` (bad numbers, JSON, text encodings, numpy headers), ``struct.error``,
    ``EOFError``, ``OverflowError``, and the unpickler's, zip's and zlib's own errors. An
    ``AttributeError``, ``TypeError``, ``KeyError`` or ``IndexError`` is not among them: where
    a file's structure can be wrong, readers check it and raise a
    :class:`CorruptCheckpointError` naming what was wrong.
    """
    import pickle
    import struct
    import zipfile
    import zlib

    return (ValueError, struct.error, EOFError, OverflowError, pickle.UnpicklingError,
            zipfile.BadZipFile, zlib.error)


_BUG_NOTE = ("torchgraft: this is a bug in torchgraft, not a fault of the file '{path}'; please "
             "report it with this traceback")


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Name ``path`` in any failure while reading it; bad bytes become a library error.

    Errors of ours get the path if they lack one. What a parser raises on bad bytes
    (:func:`parse_errors`) becomes a :class:`CorruptCheckpointError`, nesting too deep one
    too, and an operating-system error a :class:`TorchgraftError` (a missing file a
    :class:`CheckpointNotFoundError`), a feature the parser lacks (``NotImplementedError``,
    from ``zipfile``) an :class:`UnsupportedCheckpointError`. Anything else is a fault of
    torchgraft's own code: it propagates as it is, with a note saying it is a bug (the
    original traceback kept).

    Args:
        path: The file or directory being read.

    Yields:
        Nothing; the body is guarded.

    Raises:
        TorchgraftError: For a failure caused by the file or the system.
    """
    try:
        yield
    except TorchgraftError as exc:
        raise exc.located(path) from exc.__cause__
    except RecursionError:
        raise CorruptCheckpointError("its structure nests too deeply", path=path) from None
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"a file it needs is missing ({exc.strerror}: "
                                      f"{exc.filename})", path=path) from exc
    except OSError as exc:
        raise TorchgraftError(f"cannot be read: {exc.strerror or exc}", path=path) from exc
    except NotImplementedError as exc:  # zipfile: a compression method or encryption
        raise UnsupportedCheckpointError(f"it uses what its parser does not read "
                                         f"({brief(exc)})", path=path) from exc
    except parse_errors() as exc:
        raise CorruptCheckpointError(
            f"the file is truncated or malformed ({brief(exc)})", path=path
        ) from exc
    except Exception as exc:
        note = _BUG_NOTE.format(path=path)
        add_note = getattr(exc, "add_note", None)  # Python 3.11+
        if add_note is not None and note not in getattr(exc, "__notes__", ()):
            add_note(note)
        raise
