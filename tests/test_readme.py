"""The README's worked examples are what the `snlab` command prints today: every
``$ snlab ...`` transcript in a ```text block is run (continuation lines joined) and its
output (stdout and stderr) compared line by line with the block."""

import re
import shlex
from pathlib import Path

import pytest

from snlab.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def transcripts() -> list[tuple[str, str]]:
    """(command, expected output) for each ``$ snlab`` block of the README."""
    found = []
    for block in re.findall(r"```text\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S):
        if not block.startswith("$ snlab "):
            continue
        lines = block.rstrip("\n").split("\n")
        command = lines.pop(0)[2:]
        while command.endswith("\\"):
            command = command[:-1] + " " + lines.pop(0).strip()
        found.append((command, "\n".join(lines)))
    return found


def test_the_readme_has_transcripts():
    assert len(transcripts()) >= 3


@pytest.mark.parametrize("command, expected", transcripts(), ids=lambda x: x.split(" --")[0][:30])
def test_a_readme_transcript_is_what_the_command_prints(command, expected, capsys):
    try:
        main(shlex.split(command)[1:])
    except SystemExit:
        pass
    out = capsys.readouterr()
    printed = (out.out + out.err).rstrip("\n").split("\n")
    assert printed == expected.split("\n")
