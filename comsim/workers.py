"""Worker processes that end with the process that started them.

    pool = mp.get_context("spawn").Pool(n, initializer=exit_with_parent, initargs=(os.getpid(),))

A spawned worker outlives a parent killed with kill -9 and finishes what it was doing; a rerun
started meanwhile would then share an output folder (a staged episode, an arm's folder, a trial
log) with it. This initializer ends the worker as soon as its parent is gone.

``torch_threads(n)`` runs a block with n torch threads: a CPU reduction's order, and so its last bits,
depend on the thread count, and a stage must give the same numbers whether it runs after others that
changed the count (``comsim convert`` sets its own) or alone, when a rerun resumes at it.
"""
import contextlib
import os
import threading
import time


@contextlib.contextmanager
def torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def exit_with_parent(parent: int) -> None:
    """Worker initializer: end this process when process ``parent`` dies (kill -9 included)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
