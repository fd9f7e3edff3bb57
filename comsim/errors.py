"""The one error type of the package: every refusal of bad input is a ``ComSimError``.

The ``comsim`` command and the train/eval scripts print a ComSimError as one line (the file,
the field, what was expected) and exit with status 2; any other exception is a bug and keeps
its traceback. Most subclasses are also a ``ValueError``, so a caller's ``except ValueError``
catches bad input too.
"""
from __future__ import annotations

import errno
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota: the same to a writer


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


class OutOfSpaceError(ComSimError):
    """The disk (or quota) filled up while writing: finished work stays, a rerun with space resumes it."""


def no_space(e: BaseException | None) -> bool:
    """True when ``e``, or an exception it came from, is a full disk (ENOSPC) or quota (EDQUOT)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OutOfSpaceError) or (isinstance(e, OSError) and e.errno in NO_SPACE):
            return True
        e = e.__cause__ or e.__context__
    return False


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
    """Bad input or a full disk: print it as one line on stderr and return exit status 2. Anything else: re-raise."""
    if not is_bad_input(e):
        if not no_space(e):
            raise e
        e = OutOfSpaceError(f"{' '.join(str(e).split())}: the disk is full; free space, then rerun the same command "
                            "(finished work is kept and resumed)")
    print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return EXIT_BAD_INPUT
