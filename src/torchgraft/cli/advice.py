"""The command that settles a graft: the user's own, with the flags it lacks.

An unverified graft is settled by comparing outputs with the model the checkpoint was saved
from (``--verify --source-model MODULE:FACTORY``; inputs are generated from the models); an
incomplete one whose missing part looks like a new head, by declaring it new (``--new NAME``).
The advice is the command line the user typed, with those flags added, ready to copy: only
what torchgraft cannot know (which factory builds the source's model, a shape the models take)
stands as a placeholder, named as ``--help`` names it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["SHAPE_PLACEHOLDER", "SOURCE_PLACEHOLDER", "declaring_command", "settling_command"]

#: What stands for the factory of the source's model.
SOURCE_PLACEHOLDER = "MODULE:FACTORY"
#: What stands for a shape the models take.
SHAPE_PLACEHOLDER = "N,C,H,W"
#: Flags the advice sets itself.
_VERIFY = ("--verify", "--no-verify")


def settling_command(typed: Sequence[str], *, source_model: bool, inputs: bool) -> str:
    """The user's command with ``--verify`` and what it needs, as one line to copy.

    Args:
        typed: The arguments as typed, after the program's name (``graft SRC --model ...``).
        source_model: Whether they give ``--source-model`` already.
        inputs: Whether they give inputs already (``--inputs``, ``--input-shape``): without,
            and with a source model that was not compared with, a shape is asked for.

    Returns:
        The command, quoted for a POSIX shell.
    """
    words = ["torchgraft", *(word for word in typed if word not in _VERIFY), "--verify"]
    if not source_model:
        words += ["--source-model", SOURCE_PLACEHOLDER]
    elif not inputs:
        words += ["--input-shape", SHAPE_PLACEHOLDER]
    return shlex.join(words)


def declaring_command(typed: Sequence[str], modules: Sequence[str]) -> str:
    """The user's command with ``--new NAME`` for each module, as one line to copy.

    Args:
        typed: The arguments as typed, after the program's name.
        modules: The modules to declare new (:meth:`GraftReport.proposed_new`).

    Returns:
        The command, quoted for a POSIX shell.
    """
    return shlex.join(["torchgraft", *typed, *(w for m in modules for w in ("--new", m))])
