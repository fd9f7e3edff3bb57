"""One writer per output folder: ``with output_lock(out, "comsim generate"): ...``.

Two runs writing into one folder (a rerun started while the first still works, two jobs of a
cluster array given the same ``--out``) would stage the same episodes, overwrite each other's
manifests and close a dataset the other is still filling. So each command that writes an output
folder holds a lock on it for as long as it writes:

- the lock is the file ``OUT/.comsim-lock``, holding ``{"command", "pid", "host", "since"}``, and an
  exclusive ``flock`` on it. The kernel drops a flock when its process ends, kill -9 included
  (over NFS the server does, when the client's lease ends), so the lock of a process that is gone
  is free: the next run takes it over and says whose it was;
- a second writer, while the first holds it, gets ``OutputLockedError`` naming the command, pid and
  host that hold it, and writes nothing;
- released, the file is removed, so a finished output holds no trace of it; a folder the lock made
  for a run that then wrote nothing (it failed a check) is removed too.

Shards of one conversion (``comsim convert --num-shards K --shard-index j``) write one folder side
by side by design: shard j holds ``OUT/.comsim-lock-shard-j`` exclusively and ``OUT/.comsim-lock``
shared, so shards run together, the same shard twice does not, and neither does an unsharded run
(which closes the dataset) while any shard works.

On a filesystem without flock, the pid and host decide: a lock of this host whose process is gone
is taken over; a lock of another host is refused (remove the file once that run is known to be gone).
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from comsim.errors import ComSimError

LOCK_FILE = ".comsim-lock"  # every file whose name starts with it is a lock (shards add a suffix)


class OutputLockedError(ComSimError):
    """Another process is writing into the output folder."""


def is_lock_file(name: str) -> bool:
    return name.startswith(LOCK_FILE)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        d = json.loads(os.read(fd, 4096).decode() or "{}")
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(h: dict) -> str:
    if not h:
        return "another process (it has not written its name yet)"
    return f"`{h.get('command', '?')}` (pid {h.get('pid', '?')} on host {h.get('host', '?')}, since {h.get('since', '?')})"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # someone else's process, or no pid to test: assume it runs
    return True


def _flock(fd: int, how: int) -> bool | None:
    """True: taken; False: held by another process; None: this filesystem has no flock."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise


class _Lock:
    """One lock file, held with flock(``how``) from ``acquire`` to ``release``."""

    def __init__(self, path: Path, how: int):
        self.path, self.how, self.fd = path, how, None

    def acquire(self) -> tuple[bool, dict]:
        """(True, {} or the stale holder it replaces) when taken; (False, holder) when held."""
        for _ in range(20):  # retried only when the file was replaced under us
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError as e:  # another user's folder or lock: not this run's to write
                raise OutputLockedError(f"{self.path}: cannot open the output lock ({e.strerror}); the folder "
                                        "belongs to another user's run, or is read-only: choose another folder") from None
            got = _flock(fd, self.how)
            if got is None:  # no flock here: the pid and host decide
                h = _holder(fd)
                mine = h.get("host") == socket.gethostname()
                if h and (not mine or _alive(h.get("pid"))) and h.get("pid") != os.getpid():
                    os.close(fd)
                    return False, h
                got = True
            if not got:
                h = _holder(fd)
                os.close(fd)
                return False, h
            try:  # the holder before us may have removed the file between our open and our flock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return True, _holder(fd)
            os.close(fd)
        raise OutputLockedError(f"{self.path}: the lock file keeps being replaced; is another run starting here?")

    def write(self, info: dict) -> None:
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, (json.dumps(info) + "\n").encode())
        os.fsync(self.fd)

    def upgrade(self) -> bool:
        """Shared -> exclusive, if no other process holds it now (else the shared hold is lost too:
        flock drops it first, so of several holders upgrading at once, at least one gets it)."""
        if self.how != fcntl.LOCK_EX:
            if _flock(self.fd, fcntl.LOCK_EX) is False:
                return False
            self.how = fcntl.LOCK_EX
        return True

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if self.how == fcntl.LOCK_EX or _flock(self.fd, fcntl.LOCK_EX) is not False:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # still ours (exclusive): nobody else holds this inode
        finally:
            os.close(self.fd)
            self.fd = None


class OutputLock:
    """What ``output_lock`` yields: ``alone()`` tells a shard whether it may finish the folder."""

    def __init__(self, out: Path, main: "_Lock", info: dict):
        self.out, self._main, self._info = out, main, info

    def alone(self) -> bool:
        """True when no other writer holds the folder now; it then stays this run's alone (shards: the
        one of several finishing together that closes the dataset)."""
        if not self._main.upgrade():
            return False
        self._main.write(self._info)
        return True


@contextlib.contextmanager
def output_lock(out: str | Path, command: str, shard: int | None = None, log=_stderr):
    """Hold the lock of the output folder ``out`` (made if missing) while the block runs; yields an
    ``OutputLock``.

    Raises OutputLockedError when another live process holds it. ``shard``: the shard index of a
    sharded run (see the module docstring). ``log``: told when a stale lock is taken over.
    """
    out = Path(out)
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise ComSimError(f"{out}: cannot make the output folder ({e.strerror}); choose a folder you may write") from None
    info = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    held: list[_Lock] = []
    try:
        wanted = [(out / LOCK_FILE, fcntl.LOCK_EX)] if shard is None else \
            [(out / f"{LOCK_FILE}-shard-{shard}", fcntl.LOCK_EX), (out / LOCK_FILE, fcntl.LOCK_SH)]
        for path, how in wanted:
            lock = _Lock(path, how)
            ok, h = lock.acquire()
            if not ok:
                if not h and path.name == LOCK_FILE:
                    h = _shard_holder(out)
                raise OutputLockedError(
                    f"{out}: {_describe(h)} is writing into this folder; wait for it to finish or choose another "
                    f"folder (if that process is known to be gone, delete {path})")
            held.append(lock)
            if h and h.get("pid") != os.getpid():
                log(f"comsim: {out}: taking over the lock of {_describe(h)}: that process is gone")
            if how == fcntl.LOCK_EX:
                lock.write(info)
            elif h:  # shared: nobody holds it exclusively, so what it names is gone
                os.ftruncate(lock.fd, 0)
        yield OutputLock(out, held[-1], info)
    finally:
        for lock in reversed(held):
            lock.release()
        for p in made:  # folders made for this run that it left empty
            try:
                p.rmdir()
            except OSError:
                break


def _shard_holder(out: Path) -> dict:
    """Who holds a shard lock of ``out`` (an unsharded run is refused while shards work)."""
    for p in sorted(out.glob(f"{LOCK_FILE}-shard-*")):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            if _flock(fd, fcntl.LOCK_SH) is False:
                h = _holder(fd)
                if h:
                    return {**h, "command": f"{h.get('command', '?')} (shard {p.name.rsplit('-', 1)[-1]})"}
        finally:
            os.close(fd)
    return {}
