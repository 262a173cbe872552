"""The command line run in a subprocess with one system call slowed, as on a slow disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: Runs the command line with one system call slowed: ``copy`` (os.copy_file_range, the kernel
#: copies of convert) or ``write`` (os.pwrite, tensors written from memory), adding a byte to a
#: marker file at each slowed call (so its size counts them); ``none`` slows nothing.
LAUNCHER = '''
import os, sys, time
from pathlib import Path

marker, slow = Path(sys.argv[1]), sys.argv[2]


def slowed(real, first_mib):
    def call(*args):
        with marker.open("ab") as counted:
            counted.write(b".")
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


def start(tmp_path: Path, slow: str, *args: str,
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
    """Start ``torchgraft ARGS`` with ``slow`` (``copy`` or ``write``) slowed; its marker file."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    marker = tmp_path / "copying"
    process = subprocess.Popen([sys.executable, str(launcher), str(marker), slow, *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    return process, marker


