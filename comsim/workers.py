"""Worker processes that end with the process that started them.

    pool = mp.get_context("spawn").Pool(n, initializer=exit_with_parent, initargs=(os.getpid(),))

A spawned worker outlives a parent killed with kill -9 and finishes what it was doing; a rerun
started meanwhile would then share an output folder (a staged episode, an arm's folder, a trial
log) with it. This initializer ends the worker as soon as its parent is gone.

``job_results(work, jobs, workers, ...)`` runs work(job) for every job, in this process or in such a
pool, and stops the pool when the caller's block ends, on an error too.

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


@contextlib.contextmanager
def job_results(work, jobs: list, workers: int, initializer=None, initargs: tuple = (), init_inline: bool = False):
    """``with job_results(work, jobs, workers) as results: for r in results: ...``: work(job) for every job, in
    completion order. One worker or one job: in this process (``initializer(*initargs)`` first if
    ``init_inline``); else a spawn pool whose workers run ``initializer(*initargs, <this pid>)`` and end with
    this process. Leaving the block stops the pool, on an error too: what workers staged stays for a resume."""
    if workers == 1 or len(jobs) <= 1:
        if initializer is not None and init_inline:
            initializer(*initargs)
        yield map(work, jobs)
        return
    import multiprocessing as mp

    pool = mp.get_context("spawn").Pool(min(workers, len(jobs)), initializer=initializer,
                                        initargs=(*initargs, os.getpid()))
    try:
        yield pool.imap_unordered(work, jobs)
    finally:
        pool.terminate()
        pool.join()


def run_jobs(work, jobs: list, workers: int, desc: str, progress: bool, postfix, initializer=None,
             initargs: tuple = (), init_inline: bool = False) -> list:
    """``job_results`` under a progress bar of ``jobs`` episodes: returns the results (completion order);
    ``postfix(results so far)`` is the bar's running note, e.g. a success count."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=desc, unit="episode", disable=not progress)
    done = []
    try:
        with job_results(work, jobs, workers, initializer, initargs, init_inline) as results:
            for r in results:
                done.append(r)
                bar.update(1)
                bar.set_postfix_str(postfix(done))
    finally:
        bar.close()
    return done
