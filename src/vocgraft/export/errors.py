"""The export stage's error: a model or tokenizer it cannot write for the engine, named with the fix."""

from __future__ import annotations

from vocgraft.errors import UserError


class ExportError(UserError, ValueError):
    """An input the export cannot turn into a file the engine runs as vocgraft does; the message says why and what
    to do (the CLI prints it as one line)."""


class ExportRefused(ExportError):
    """llama.cpp would tokenize differently from the model's tokenizer; ``choice`` is the nearest llama.cpp type
    (a :class:`~vocgraft.export.tokenizer.TokenizerChoice`) and ``mismatch`` how much text differs under it."""

    def __init__(self, message: str, choice, mismatch):
        super().__init__(message)
        self.choice, self.mismatch = choice, mismatch
