"""The command line run in a subprocess with one system call slowed, as on a slow disk.

A copy can also be held after its first :data:`HOLD` slowed calls until the test releases it
(:func:`release`): a test that interrupts a copy then does so mid-copy however loaded the
machine is (a copy that finished before a descheduled test sent its signal once made the test
fail under load).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: Slowed calls a held copy makes before it waits for its release.
HOLD = 4

#: Runs the command line with one system call slowed: ``copy`` (os.copy_file_range, the kernel
#: copies of convert) or ``write`` (os.pwrite, tensors written from memory), adding a byte to a
#: marker file at each slowed call (so its size counts them), and waiting from the
#: :data:`HOLD`-th until a release file exists; ``none`` slows nothing.
LAUNCHER = f'''
import os, signal, sys, time
from pathlib import Path

# Ctrl-C as a terminal gives it: a suite started in the background by a script (bash's
# "cmd &") hands its children SIGINT ignored, and they would not stop
signal.signal(signal.SIGINT, signal.default_int_handler)

marker, slow = Path(sys.argv[1]), sys.argv[2]
released = marker.with_suffix(".release")


def slowed(real, first_mib):
    def call(*args):
        with marker.open("ab") as counted:
            counted.write(b".")
        while marker.stat().st_size >= {HOLD} and not released.exists():
            time.sleep(0.02)
        time.sleep(0.1)
        return real(*first_mib(args))
    return call


if slow == "copy":
    os.copy_file_range = slowed(os.copy_file_range,
                                lambda a: (a[0], a[1], min(a[2], 1 << 20), *a[3:]))
elif slow == "write":
    os.pwrite = slowed(os.pwrite, lambda a: (a[0], memoryview(a[1]).cast("B")[:1 << 20], a[2]))
sys.argv = ["torchgraft", *sys.argv[3:]]
from torchgraft.cli.main import main

sys.exit(main())
'''

MODEL = "import torch\n\ndef net():\n    return torch.nn.Linear(2048, 4096)\n"


def release(marker: Path) -> None:
    """Let a held copy go on."""
    marker.with_suffix(".release").touch()


def start(tmp_path: Path, slow: str, *args: str, env: dict[str, str] | None = None,
          held: bool = False) -> tuple[subprocess.Popen[str], Path]:
    """Start ``torchgraft ARGS`` with ``slow`` (``copy`` or ``write``) slowed; its marker file.

    ``held``: the copy waits after :data:`HOLD` slowed calls until :func:`release`.
    """
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    marker = tmp_path / "copying"
    if not held:
        release(marker)
    process = subprocess.Popen([sys.executable, str(launcher), str(marker), slow, *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    return process, marker


