"""Errors raised for bad input: each names the field and what it accepts."""

from __future__ import annotations


class SnlabError(ValueError):
    """Bad input to snlab.

    ``field`` names what was wrong (``"system.scale_up.bandwidth"``, ``"tp"``) and
    ``allowed`` says what would have been accepted; the message carries both, so the
    command line and the widgets can show ``str(error)`` as one clear line.
    """

    def __init__(self, field: str, problem: str, allowed: str | None = None):
        self.field = field
        self.problem = problem
        self.allowed = allowed
        text = f"{field}: {problem}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


class UnknownPresetError(SnlabError, KeyError):
    """A preset name that is neither a shipped preset nor a readable TOML path."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        super().__init__(
            kind,
            f"unknown {kind} preset {name!r}",
            "one of " + ", ".join(valid) + ", or a path to a .toml file",
        )

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return ValueError.__str__(self)
