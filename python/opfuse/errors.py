"""The one exception type users see, and its exit codes (docs/architecture.md, "Errors")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_INTERNAL_ERROR = 2


class OpfuseError(Exception):
    """An error opfuse reports to the user: bad input, an unsupported construct, a failed stage.

    Attributes:
        diagnostics: MLIR-style lines (``file:line:col: error: ...``) collected while the
            error happened; printed by the tools instead of a traceback.
        exit_code: 1 for a user error, 2 for an internal error (with a reproducer).
    """

    def __init__(self, message: str, *, diagnostics: list[str] | None = None, exit_code: int = 1):
        super().__init__(message)
        self.diagnostics = list(diagnostics or [])
        self.exit_code = exit_code

    def render(self) -> str:
        """The message and its diagnostics, as the tools print them."""
        lines = [*self.diagnostics]
        if not lines or str(self) not in lines[0]:
            lines.insert(0, f"error: {self}")
        return "\n".join(lines)
