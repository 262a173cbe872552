"""Where tensors go when they are read: ``"cpu"``, ``"cuda:0"``, or a mapping of saved devices."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from .errors import DeviceError

__all__ = ["DeviceMap", "DeviceSpec"]

DeviceSpec = str | torch.device | Mapping[str, "str | torch.device"]


def _available(device: torch.device) -> bool:
    if device.type in ("cpu", "meta"):
        return True
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if device.type == "mps":
        is_available = torch.backends.mps.is_available
    if is_available is None or not is_available():
        return False
    count = getattr(backend, "device_count", None)
    return device.index is None or count is None or device.index < count()


def _parse(value: str | torch.device, *, what: str) -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"{what} {value!r} is not a device: {exc}") from None


class DeviceMap:
    """Decide the device of each tensor from where it was saved.

    Args:
        spec: ``"cpu"``, ``"cuda:0"``, a :class:`torch.device`, or a mapping from saved
            locations to devices, e.g. ``{"cuda:1": "cuda:0"}``. A mapping key may also be a
            device type (``"cuda"``) that covers every index. Saved locations a mapping does not
            name stay where they were saved when that device exists here.

    Raises:
        DeviceError: If a requested device does not exist on this machine.
    """

    def __init__(self, spec: DeviceSpec = "cpu") -> None:
        self._default: torch.device | None = None
        self._mapping: dict[str, torch.device] = {}
        if isinstance(spec, Mapping):
            for key, value in spec.items():
                self._mapping[str(key)] = self._checked(_parse(value, what="device"))
        else:
            self._default = self._checked(_parse(spec, what="device"))

    @staticmethod
    def _checked(device: torch.device) -> torch.device:
        if not _available(device):
            raise DeviceError(
                f"device '{device}' was requested but this machine does not have it "
                f"(torch.{device.type} is not available or has fewer devices). "
                "Pass device='cpu', or map it: device={'" + str(device) + "': 'cpu'}."
            )
        return device

    def target(self, saved: str, *, name: str, path: str | Path | None = None) -> torch.device:
        """Return the device a tensor saved on ``saved`` goes to.

        Args:
            saved: The saved location, e.g. ``"cuda:1"``.
            name: The tensor's name, for the error message.
            path: The checkpoint, for the error message.

        Returns:
            The target device.

        Raises:
            DeviceError: If the mapping does not cover ``saved`` and that device is not here.
        """
        if self._default is not None:
            return self._default
        saved_type = saved.split(":", 1)[0]
        for key in (saved, saved_type):
            if key in self._mapping:
                return self._mapping[key]
        device = _parse(saved, what="saved location")
        if _available(device):
            return device
        raise DeviceError(
            f"tensor '{name}' was saved on '{saved}', which this machine does not have, and the "
            f"device mapping does not name it. Add it, e.g. {{'{saved}': 'cpu'}}.",
            path=path,
        )
