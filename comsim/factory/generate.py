"""`comsim generate`: mass-produce simulated episodes of a task in parallel, as a LeRobotDataset.

    report = generate_dataset("stack", episodes=200, out="data/sim_stack", workers=2)

Episode ``k`` runs the seed ``episode_seed(seed, k, attempt)``, so a dataset does not depend
on how many workers made it or on interruptions: workers (spawned processes, each with its
own MuJoCo model and renderer) stage finished episodes atomically into ``out`` through
``DatasetWriter.add_episode(ep, episode_index=k)``; the parent joins them with one
``close()``. A rerun with the same arguments skips what is already staged.

Failures are data too. By default a failed attempt is KEPT, flagged ``success=False`` with
its reason in the provenance (``extra.failure``), because a filtered dataset silently
overstates the expert. ``only_success=True`` instead retries episode ``k`` with new seeds
(attempt 1, 2, ...) up to ``max_attempts`` and records each discarded attempt in the kept
episode's provenance, so the counts survive a resume. ``generation_report.json`` (written
after closing) counts attempts, successes and failures by reason.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path


from comsim.io.keys import CONTROLS
from comsim.io.lerobot import DatasetWriter, LeRobotDataset, check_resumable, dataset_complete
from comsim.io.files import atomic_output, write_json
from comsim.episode import check_seed
from comsim.errors import InputError
from comsim.io.lock import output_lock
from comsim.io.paths import check_output_path, claim_output
from comsim.sim.spec import spec_hash
from comsim.workers import exit_with_parent, run_jobs

HEADER_FILE = "generation.json"
REPORT_FILE = "generation_report.json"
TASK_FILE = "task.yaml"  # the task as generated, when it was moved to another scene
RESUME_KEYS = ("task", "program_hash", "seed", "split", "only_success", "max_attempts", "controls", "fps")

# One program and one robot-only scene per worker process (built on first use).
_WORKER: dict = {}


def _worker_state(task_path: str):
    if _WORKER.get("path") != task_path:
        from comsim.factory.expert import robot_only_scene
        from comsim.factory.program import load_program

        program = load_program(task_path)
        _WORKER.update(path=task_path, program=program, robot=robot_only_scene(program),
                       twin_hash=spec_hash(program.scene))
    return _WORKER["program"], _WORKER["robot"], _WORKER["twin_hash"]


def make_episode(task_path: str, index: int, seed: int, split: str, only_success: bool, max_attempts: int,
                 controls: tuple[str, ...]):
    """Episode ``index``: attempts until one succeeds (only_success) or just one. Returns
    (EpisodeResult of the kept attempt, list of discarded attempts)."""
    from comsim.factory.expert import prepare_setup, run_episode
    from comsim.episode import episode_seed

    program, robot, twin_hash = _worker_state(task_path)
    discarded = []
    n_attempts = max_attempts if only_success else 1
    for attempt in range(n_attempts):
        s = episode_seed(seed, index, attempt)
        setup, redraws = prepare_setup(program, s, split, robot)
        result = run_episode(program, setup, controls, twin_hash)
        extra = result.episode.provenance.extra
        extra.update(episode_index=index, attempt=attempt, layout_redraws=redraws)
        if result.success or attempt == n_attempts - 1:
            extra["discarded_attempts"] = discarded
            extra["gave_up"] = bool(only_success and not result.success)
            return result
        discarded.append({"attempt": attempt, "seed": s, "failure": result.failure, "detail": result.detail,
                          "layout_redraws": redraws})
    raise AssertionError("unreachable")


def _work(args) -> dict:
    """Worker entry: make episode ``index`` and stage it; returns a small summary."""
    task_path, out, fps, index, seed, split, only_success, max_attempts, controls = args
    result = make_episode(task_path, index, seed, split, only_success, max_attempts, controls)
    DatasetWriter(out, fps, resume=True).add_episode(result.episode, episode_index=index)
    extra = result.episode.provenance.extra
    return {"index": index, "success": result.success, "failure": result.failure,
            "attempts": 1 + len(extra["discarded_attempts"]), "frames": len(result.episode)}


def _init_worker(parent: int | None = None):
    # llvmpipe (software OpenGL) starts one render thread per core in every process; with one
    # worker per core they would fight. Must be set before the first GL context.
    os.environ.setdefault("LP_NUM_THREADS", "1")
    if parent is not None:  # a worker ends with the process that started it (kill -9 included): a rerun
        exit_with_parent(parent)  # never races one still staging an episode into the same folder


def check_counts(**counts: int) -> None:
    """Each count (episodes, workers, attempts...) at least 1, else an InputError naming it."""
    for name, value in counts.items():
        if value < 1:
            raise InputError(None, name, "at least 1", value)


def check_task(task: str | Path, seed: int = 0, split: str = "id", layouts: int = 8):
    """Load a task and vet ``layouts`` of its episodes with IK: a task whose regions or targets are
    out of reach fails here (ProgramError naming the line), before anything is written."""
    from comsim.factory.expert import prepare_setup, robot_only_scene
    from comsim.episode import episode_seed
    from comsim.factory.program import load_program

    program = load_program(task)
    robot = robot_only_scene(program)
    for k in range(layouts):
        prepare_setup(program, episode_seed(seed, k), split, robot)
    return program


def generate_dataset(task: str | Path, episodes: int, out: str | Path, *, workers: int = 1, seed: int = 0,
                     split: str = "id", only_success: bool = False, max_attempts: int = 10,
                     controls: tuple[str, ...] | list[str] = (), scene: str | Path | None = None,
                     progress: bool = True) -> dict:
    """Generate ``episodes`` episodes of ``task`` (a task YAML or built-in name) into ``out``.

    ``scene``: generate in this twin scene instead of the task's own (e.g. the aligned twin,
    PAIRED/twin_aligned.yaml); the retargeted task is kept as OUT/task.yaml.

    Checks the task (with IK on sampled layouts) before anything is written; returns the report.
    """
    check_counts(episodes=episodes, workers=workers, max_attempts=max_attempts)
    controls = tuple(controls)
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise InputError(None, "controls", f"some of {list(CONTROLS)}", bad)
    check_seed(seed)
    _init_worker()
    out = check_output_path(out)
    claim_output(out, HEADER_FILE, None, (), "comsim generate")  # a foreign folder is refused before any work
    with tempfile.TemporaryDirectory() as tmp:
        if scene is not None:  # retargeted in a scratch folder: nothing goes into `out` before it is claimed
            from comsim.factory.program import load_program, task_in_scene
            from comsim.sim.spec import load_scene_spec

            load_program(task)  # errors name the user's files, not the scratch copy
            load_scene_spec(scene)
            task = task_in_scene(task, scene, Path(tmp) / TASK_FILE)
        program = check_task(task, seed, split)
        cam = program.scene.camera(program.camera)
        if cam.width % 2 or cam.height % 2:  # else the first episode's video fails, after the run's files are made
            raise InputError(scene or program.path, f"cameras ({cam.name}).width/height",
                             "an even width and height (episodes are stored as H.264 video)", f"{cam.width}x{cam.height}")
        task_path = str((out / TASK_FILE).resolve() if scene is not None else program.path.resolve())
        header = {"command": "comsim generate", "task": program.name, "program": task_path,
                  "program_hash": program.hash, "seed": seed, "split": split, "only_success": only_success,
                  "max_attempts": max_attempts if only_success else 1, "controls": list(controls),
                  "fps": program.fps, "camera": program.camera, "twin_spec_hash": spec_hash(program.scene)}
        claim_output(out, HEADER_FILE, header, RESUME_KEYS, "comsim generate", made="was generated")
        check_resumable(out, episodes, "generate")
        with output_lock(out, "comsim generate"):  # one writer per output; everything above wrote nothing
            return _generate(out, header, program, scene is not None, task_path, episodes, workers, seed, split,
                             only_success, controls, progress)


def _generate(out: Path, header: dict, program, retargeted: bool, task_path: str, episodes: int, workers: int,
              seed: int, split: str, only_success: bool, controls: tuple, progress: bool) -> dict:
    """The writing part of ``generate_dataset``, with the output locked and every input checked."""
    # again, now that no other writer can be at work: a run that made this folder meanwhile
    resuming = claim_output(out, HEADER_FILE, header, RESUME_KEYS, "comsim generate", made="was generated")
    if not resuming:
        write_json(header, out / HEADER_FILE)  # first file: it makes the folder this run's
    if retargeted:
        with atomic_output(out / TASK_FILE) as dst:
            shutil.copyfile(program.path, dst)
    writer = DatasetWriter(out, program.fps, resume=True)
    if dataset_complete(out):  # finished before (with as many episodes: checked)
        return write_report(out, header, workers, elapsed=None)

    todo = [i for i in range(episodes) if i not in writer.finished_episodes]
    jobs = [(task_path, str(out), program.fps, i, seed, split, only_success, header["max_attempts"], controls)
            for i in todo]
    t0 = time.perf_counter()
    run_jobs(_work, jobs, workers, f"generate {program.name}", progress,
             lambda done: f"success={sum(r['success'] for r in done)}/{len(done)}", _init_worker)
    elapsed = time.perf_counter() - t0
    writer.close()
    return write_report(out, header, workers, elapsed=elapsed, generated=len(jobs))


def write_report(out: Path, header: dict, workers: int, elapsed: float | None, generated: int = 0) -> dict:
    """Count attempts, successes and failures (by reason) from the closed dataset's provenance."""
    ds = LeRobotDataset(out)
    attempts = successes = gave_up = redraws = frames = 0
    reasons: Counter = Counter()
    for i in range(len(ds)):
        info = ds.episode_info(i)
        extra = info["provenance"].extra
        frames += info["length"]
        for d in extra.get("discarded_attempts", []):
            attempts += 1
            reasons[d["failure"]] += 1
            redraws += d.get("layout_redraws", 0)
        attempts += 1
        redraws += extra.get("layout_redraws", 0)
        if info["success"]:
            successes += 1
        else:
            reasons[extra.get("failure") or "unknown"] += 1
        gave_up += bool(extra.get("gave_up"))
    report = {
        "task": header["task"], "split": header["split"], "seed": header["seed"], "episodes": len(ds),
        "frames": frames, "attempts": attempts, "successes": successes, "failures": attempts - successes,
        "success_rate": round(successes / max(attempts, 1), 4),
        "failures_by_reason": dict(sorted(reasons.items())),
        "failed_episodes_kept": 0 if header["only_success"] else len(ds) - successes,
        "only_success": header["only_success"], "gave_up": gave_up, "layout_redraws": redraws,
        "workers": workers, "generated_now": generated,
        "elapsed_s": None if elapsed is None else round(elapsed, 2),
        "episodes_per_minute": None if not elapsed or not generated else round(60 * generated / elapsed, 2),
    }
    write_json(report, out / REPORT_FILE)
    return report
