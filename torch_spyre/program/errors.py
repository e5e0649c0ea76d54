"""The error of a malformed program, located at its core and instruction."""

from __future__ import annotations

from typing import Any

from ..errors import SpyreError
from .format import format_instruction


class ProgramError(SpyreError, ValueError):
    """A malformed program. The message names the core and the instruction."""

    def __init__(self, message: str, core: int | None = None, index: int | None = None, instr: Any = None):
        self.core, self.index, self.instr = core, index, instr
        where = ""
        if core is not None:
            where = f"core {core}"
            if index is not None:
                where += f", instruction {index}"
                if instr is not None:
                    where += f" ({format_instruction(instr)})"
            where += ": "
        super().__init__(where + message)
