"""Writing files whole, and ending a command cleanly on Ctrl-C.

A file is written to a temporary name beside it and renamed into place (``os.replace``
is atomic on POSIX and Windows), so an interrupted write, or two processes writing the
same path, never leave a half-written file where a reader could find it: the path
holds the old content or the new, whole.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable


def write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` whole (a temporary file beside it, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_text(path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` whole."""
    return write_bytes(path, text.encode("utf-8"))


def interruptible(main: Callable[..., int], prog: str) -> Callable[..., int]:
    """``main`` that ends on Ctrl-C with one line (``prog: interrupted``) and exit
    status 130, the shell's code for SIGINT, instead of a traceback."""
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
    run.__doc__ = main.__doc__
    run.__name__ = main.__name__
    return run
