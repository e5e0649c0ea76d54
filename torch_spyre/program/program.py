"""The :class:`Program`: declared operands plus one instruction stream per core."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import ProgramError
from .format import format_program
from .instructions import Instruction
from .operands import Operand
from .serialization import decode_program, encode_program


@dataclass
class Program:
    name: str
    operands: list[Operand]
    cores: dict[int, list[Instruction]]
    # Free-form provenance (source ATen ops, compiler decisions); carried through serialization.
    metadata: dict[str, Any] = field(default_factory=dict)

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(name)

    def instructions(self) -> Iterator[tuple[int, int, Instruction]]:
        for core in sorted(self.cores):
            for i, ins in enumerate(self.cores[core]):
                yield core, i, ins

    # --- serialization (program/serialization.py) -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return encode_program(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Program":
        """Decode a program, checking the type of every field: a corrupt file raises :class:`ProgramError`
        naming the core, the instruction and the field, never a TypeError later."""
        return cls(*decode_program(data))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Program":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProgramError(f"program file is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    @classmethod
    def load(cls, path: str) -> "Program":
        with open(path, "rb") as f:
            return cls.from_json(f.read())

    # --- printing (program/format.py) -------------------------------------------------------------
    def format(self) -> str:
        return format_program(self)

    __str__ = format
