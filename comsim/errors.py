"""The one error type of the package: every refusal of bad input is a ``ComSimError``.

The ``comsim`` command and the train/eval scripts print a ComSimError as one line (the file,
the field, what was expected) and exit with status 2; any other exception is a bug and keeps
its traceback. Most subclasses are also a ``ValueError``, so a caller's ``except ValueError``
catches bad input too.
"""
from __future__ import annotations

import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


class ComSimError(Exception):
    """Bad input or a refused operation; the message names the file and what was expected."""


class InputError(ComSimError, ValueError):
    """A value read from ``file`` at ``field`` is not what was ``expected``.

    ``str()`` is one line: ``FILE: FIELD: expected EXPECTED, got GOT``.
    """

    def __init__(self, file: str | Path | None, field: str | None, expected: str, got: object = None):
        self.file, self.field, self.expected, self.got = file, field, expected, got
        parts = [str(p) for p in (file, field) if p not in (None, "")]
        msg = f"expected {expected}" + ("" if got is None else f", got {_short(got)}")
        super().__init__(": ".join(parts + [msg]))


def _short(x: object, limit: int = 120) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[:limit - 3] + "..."


_PACKAGE_DIR = Path(__file__).resolve().parent
# Checks written before ComSimError existed still raise these; they are bad input when a
# comsim module raised them itself (a numpy or torch one from deep inside is a bug).
_LEGACY = (ValueError, FileNotFoundError, RuntimeError)


def is_bad_input(e: BaseException) -> bool:
    """True for a ComSimError, or a legacy ValueError/FileNotFoundError/RuntimeError raised by comsim code."""
    if isinstance(e, ComSimError):
        return True
    if not isinstance(e, _LEGACY) or e.__traceback__ is None:
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _PACKAGE_DIR in Path(tb.tb_frame.f_code.co_filename).resolve().parents


def exit_for(e: BaseException, prog: str = "comsim") -> int:
    """Bad input: print it as one line on stderr and return exit status 2. Anything else: re-raise."""
    if not is_bad_input(e):
        raise e
    print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return EXIT_BAD_INPUT
