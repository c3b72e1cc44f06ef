"""The README's worked examples are what the `snlab` command prints today: every
``$ snlab ...`` transcript in a ```text block is run (continuation lines joined) and its
output (stdout and stderr) compared line by line with the block."""

import json
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


def _bash_commands() -> list[str]:
    """The `snlab` commands of the README's bash blocks, continuation lines joined, with
    their trailing comments."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S):
        command = ""
        for line in block.split("\n"):
            command += (" " if command else "") + line.strip()
            if command.endswith("\\"):
                command = command[:-1].rstrip()
                continue
            if command.startswith("snlab "):
                found.append(command)
            command = ""
    return found


@pytest.mark.parametrize("command", [c for c in _bash_commands() if "own plan" in c],
                         ids=lambda c: c.split("--model ")[1].split()[0])
def test_a_published_plan_the_readme_shows_fits(command, capsys):
    """A plan the README calls a model's own (its paper's) is given with every setting the
    paper states, so that it fits as it ran."""
    code, _, _ = command.partition("#")
    main([*shlex.split(code)[1:], "--json"])
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_the_shipped_names_are_every_preset():
    text = README.read_text(encoding="utf-8")
    start = text.index("Shipped names")
    names = set(re.findall(r"`([a-z0-9.\-]+)`", text[start:text.index("\n\n", start)]))
    data = Path(__file__).resolve().parents[1] / "snlab" / "presets" / "data"
    presets = {p.stem for kind in ("devices", "systems", "models") for p in (data / kind).glob("*.toml")}
    assert names == presets
