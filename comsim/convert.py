"""`comsim convert`: batch-translate a sim dataset into pseudo-real episodes, sharded and resumable.

    report = convert_dataset("runs/translator/final", "data/sim_stack", "data/pseudo_stack",
                             sampling=SamplingParams(w_action=1.5, w_sim=2.0, num_steps=20), workers=2)

Every episode of the input (``observation.images.<cam>_sim``, actions, states, success)
becomes an output episode with ``observation.images.<cam>`` = the translator's frames (at
the translator's resolution) next to the untouched ``<cam>_sim`` (and control) videos, and
``Provenance(source="pseudo_real", translator_hash, guidance, seed)`` (the episode is made by
``TranslatorPipeline.translate_episode``; its guidance: the SamplingParams it was sampled with).

Determinism: episode ``k`` is translated with seed ``episode_seed(seed, k)`` and a fixed
number of torch threads per process (``threads``, default 1): the same episode gives the
same frames whichever process, shard or run converted it. Resuming: finished episodes are
staged atomically by ``DatasetWriter``; a rerun skips them, so an interrupted run resumed
gives byte-identical files to an uninterrupted one.

Parallelism, three ways (each process stages its own episodes; one close at the end):
- ``workers=N``: N local processes (spawned), episodes handed out one at a time;
- ``accelerate launch ... comsim convert ...``: episodes split over accelerate's processes
  (``PartialState.split_between_processes``), each on its own device; the main one closes;
- ``num_shards=K, shard_index=j``: independent jobs (e.g. a cluster array) take episodes
  ``k % K == j``, side by side in one folder; the last to finish closes the dataset (or a final
  run without shard arguments does). The same shard twice, or an unsharded run beside a shard, is
  refused (``comsim/io/lock.py``), as is any second writer of an output.

Refused before converting anything: an input whose action dimension, camera, control
videos or frame rate differ from the translator's, or an input that already has real frames.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from comsim.config import PRECISIONS
from comsim.episode import Episode, check_seed, episode_seed
from comsim.errors import ComSimError
from comsim.io.keys import control_key, sim_key
from comsim.io.lerobot import IMAGE_PREFIX, DatasetWriter, LeRobotDataset, dataset_complete
from comsim.io.files import read_json_object, weights_hash, write_json
from comsim.io.lock import output_lock
from comsim.io.paths import check_output_path, claim_output, is_inside, safe_name
from comsim.translator.sampling import SamplingParams
from comsim.workers import exit_with_parent, torch_threads

HEADER_FILE = "conversion.json"
REPORT_FILE = "conversion_report.json"  # the closing run's timing: frames, seconds, frames/s
RESUME_KEYS = ("translator_hash", "input", "input_episodes", "num_steps", "w_action", "w_sim", "overlap", "strength",
               "precision", "seed")

_WORKER: dict = {}  # per process: the loaded pipeline and the open input dataset


class ConversionError(ComSimError, ValueError):
    """The input dataset does not fit the translator (or the output belongs to another conversion)."""


def translator_hash(model_dir: Path) -> str:
    """The checkpoint hash recorded in provenance: sha256 of the transformer weights (the same
    value as ``TranslatorPipeline.checkpoint_hash``), computed without loading torch."""
    weights = Path(model_dir) / "transformer" / "diffusion_pytorch_model.safetensors"
    if not weights.is_file():
        raise ConversionError(f"{weights}: file not found (not a translator pipeline folder?)")
    return weights_hash(weights)


def translator_meta(model_dir: Path) -> dict:
    """translator.json of a pipeline folder, its fields checked (they name files and shapes)."""
    meta_path = Path(model_dir) / "translator.json"
    if not meta_path.is_file():
        raise ConversionError(f"{model_dir}: not a translator pipeline folder (no translator.json)")
    meta = read_json_object(meta_path, ConversionError)

    def need(key, ok, expected):
        if key not in meta or not ok(meta[key]):
            raise ConversionError(f"{meta_path}: {key}: expected {expected}, got {meta.get(key, 'nothing')!r}")

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    need("camera", lambda v: isinstance(v, str) and v, "the camera name the translator renders (e.g. 'front')")
    safe_name(meta["camera"], meta_path, "camera")
    need("action_dim", count, "a positive integer")
    need("num_frames", count, "a positive integer")
    need("resolution", lambda v: isinstance(v, list) and len(v) == 2 and all(map(count, v)), "[height, width]")
    if "controls" in meta:
        need("controls", lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v), "a list of names")
        for c in meta["controls"]:
            safe_name(c, meta_path, "controls")
    if "fps" in meta:
        need("fps", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, "frames/s > 0")
    return meta


def load_translator(model_dir: Path, device: str = "cpu"):
    """The pipeline in ``model_dir``, or a ConversionError naming the folder (a broken checkpoint is bad
    input here, found before anything is written)."""
    import safetensors

    from comsim.translator.pipeline import TranslatorPipeline

    translator_meta(model_dir)
    try:
        return TranslatorPipeline.from_pretrained(model_dir, device)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, json.JSONDecodeError,
            safetensors.SafetensorError) as e:
        if isinstance(e, ConversionError):
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ConversionError(f"{model_dir}: the translator does not load ({type(e).__name__}: {first}); "
                              "expected a folder written by TranslatorPipeline.save_pretrained") from e


def check_compatible(model_dir: Path, ds: LeRobotDataset) -> dict:
    """Translator metadata (translator.json) after checking the input against it; raises ConversionError."""
    meta = translator_meta(model_dir)
    feats, where = ds.features, f"{ds.root}/meta/info.json"
    a_dim = int(np.prod(feats.get("action", {}).get("shape", [0])))
    if a_dim != meta["action_dim"]:
        raise ConversionError(f"{where}: action has {a_dim} values per frame but the translator {model_dir} "
                              f"expects action_dim={meta['action_dim']}; refusing before converting anything")
    cam = meta["camera"]
    need = [sim_key(cam)] + [control_key(cam, c) for c in meta.get("controls", [])]
    missing = [IMAGE_PREFIX + k for k in need if k not in ds.camera_keys]
    if missing:
        raise ConversionError(f"{where}: no video feature {missing}; the translator {model_dir} needs them "
                              f"(camera {cam!r}, controls {meta.get('controls', [])}); the dataset has "
                              f"{[IMAGE_PREFIX + k for k in ds.camera_keys]}")
    if cam in ds.camera_keys:
        raise ConversionError(f"{where}: already has {IMAGE_PREFIX + cam} (real or pseudo-real frames); "
                              "convert takes a sim dataset, as written by `comsim generate`")
    if abs(float(meta.get("fps", ds.fps)) - float(ds.fps)) > 1e-6:
        raise ConversionError(f"{where}: fps: expected {meta['fps']} (the translator's {model_dir} frame rate; "
                              f"its actions per frame would mean something else), got {ds.fps}")
    if len(ds) == 0:
        raise ConversionError(f"{where}: total_episodes: expected at least 1 episode to convert, got 0")
    ds.check_finite()  # NaN actions would be translated into garbage frames without a word
    ds.check_videos()  # a corrupt video is named now, not after the episodes before it are converted
    return meta


def _load_worker(model_dir: str, input_dir: str, device: str, threads: int):
    if _WORKER.get("key") != (model_dir, input_dir, device):
        import torch

        torch.set_num_threads(threads)  # fixed: CPU reductions must not depend on the machine's cores
        if device.startswith("cuda"):
            torch.backends.cudnn.benchmark = False
            torch.backends.cuda.matmul.allow_tf32 = False
        _WORKER.update(key=(model_dir, input_dir, device), pipe=load_translator(Path(model_dir), device),
                       ds=LeRobotDataset(input_dir, default_source="sim"))
    return _WORKER["pipe"], _WORKER["ds"]


def convert_episode(pipe, ep: Episode, index: int, seed: int, guidance: dict, source: str) -> Episode:
    """Episode ``index`` of the sim dataset ``source`` -> its pseudo-real version
    (``TranslatorPipeline.translate_episode``, seeded with ``episode_seed(seed, index)``); ``guidance``
    is the conversion header's SamplingParams fields and ``precision``."""
    sampling = SamplingParams(**{k: v for k, v in guidance.items() if k != "precision"})
    return pipe.translate_episode(ep, sampling, precision=guidance.get("precision", "fp32"),
                                  seed=episode_seed(seed, index),
                                  extra={"source_dataset": str(source), "source_episode": int(index)})


def _work(args) -> int:
    model_dir, input_dir, output_dir, fps, index, seed, guidance, t_hash, device, threads = args
    pipe, ds = _load_worker(model_dir, input_dir, device, threads)
    if pipe.checkpoint_hash != t_hash:  # provenance must name the weights that made the frames
        raise ConversionError(f"{model_dir}: the translator's weights changed during the conversion "
                              f"(hash {pipe.checkpoint_hash}, the conversion started with {t_hash})")
    ep = convert_episode(pipe, ds.read_episode(index), index, seed, guidance, input_dir)
    DatasetWriter(output_dir, fps, resume=True).add_episode(ep, episode_index=index)
    return len(ep)


def _accelerate_state():
    """accelerate's PartialState when this process was started by `accelerate launch`, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    from accelerate import PartialState

    # PartialState only makes a CPU process group when told so (Accelerator reads this variable itself).
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    return PartialState(cpu=cpu)


def convert_dataset(model: str | Path, input: str | Path, output: str | Path, *,
                    sampling: SamplingParams | None = None, seed: int = 0, workers: int = 1,
                    num_shards: int | None = None, shard_index: int | None = None, device: str | None = None,
                    threads: int = 1, precision: str = "fp32", progress: bool = True) -> dict:
    """Convert every episode of the sim dataset ``input`` into ``output``; returns a report dict.

    ``sampling``: fields left as None take the translator's own settings (translator.json, from its
    training config; an overlap it does not set is half a window).
    ``precision``: fp32, or bf16 (the transformer under autocast; see ``TranslatorPipeline.__call__``)."""
    model, input, output = Path(model), Path(input), Path(output)
    if (num_shards is None) != (shard_index is None):
        raise ConversionError("--num-shards and --shard-index go together")
    if num_shards is not None and not 0 <= shard_index < num_shards:
        raise ConversionError(f"--shard-index must be in [0, {num_shards}), got {shard_index}")
    if workers < 1 or threads < 1:
        raise ConversionError(f"workers and threads must be >= 1, got {workers}, {threads}")
    if precision not in PRECISIONS:
        raise ConversionError(f"precision: expected fp32 or bf16, got {precision!r}")
    check_seed(seed)
    check_output_path(output, "--output")
    if is_inside(output, input) or is_inside(input, output):
        raise ConversionError(f"{output}: --output: expected a folder outside --input {input} (and not holding "
                              "it), got the same folder or one inside the other")
    ds = LeRobotDataset(input, default_source="sim")
    check_compatible(model, ds)
    from comsim.translator.pipeline import sampling_defaults

    sampling = (sampling or SamplingParams()).resolved(sampling_defaults(model))
    n_frames = translator_meta(model)["num_frames"]
    if sampling.overlap is not None and not 0 < sampling.overlap < n_frames:
        raise ConversionError(f"overlap must be in [1, {n_frames}) frames (the translator's window is {n_frames}), "
                              f"got {sampling.overlap}")
    t_hash = translator_hash(model)
    guidance = {**sampling.to_dict(), "precision": precision}
    header = {"command": "comsim convert", "model": str(model.resolve()), "translator_hash": t_hash, "input": str(input.resolve()),
              "input_episodes": len(ds), **guidance, "seed": int(seed), "threads": threads}

    state = _accelerate_state() if num_shards is None else None
    is_main = state is None or state.is_main_process
    device = device or (str(state.device) if state is not None else "cpu")
    # torch's thread count is this run's while it runs (CPU results depend on it), the caller's after
    with torch_threads(threads):
        if is_main:
            claim_output(output, HEADER_FILE, header, RESUME_KEYS, "comsim convert", "--output", ConversionError,
                         made="holds a conversion made")
            _load_worker(str(model), str(input), device, threads)  # a model that does not load: refused before writing
        # one writer per output (the main process speaks for accelerate's others; shards side by side)
        lock = output_lock(output, "comsim convert", shard=shard_index if num_shards not in (None, 1) else None) \
            if is_main else contextlib.nullcontext()
        with lock as held:
            return _convert(ds, model, input, output, header, guidance, t_hash, state, is_main, device, threads,
                            seed, workers, num_shards, shard_index, progress, held)


def _convert(ds, model, input, output, header, guidance, t_hash, state, is_main, device, threads, seed, workers,
             num_shards, shard_index, progress, held) -> dict:
    """The writing part of ``convert_dataset``, with the output locked and every input checked."""
    if is_main:  # again, now that no other writer can be at work: a run that finished meanwhile
        claim_output(output, HEADER_FILE, header, RESUME_KEYS, "comsim convert", "--output", ConversionError,
                     made="holds a conversion made")
    writer = DatasetWriter(output, ds.fps, resume=True)
    if dataset_complete(output):  # closed before: nothing to do
        return _report(output, header, 0, 0, None)
    if is_main:
        write_json(header, output / HEADER_FILE)
    if state is not None:
        state.wait_for_everyone()  # the header is checked before anyone writes
    todo = [i for i in range(len(ds)) if i not in writer.finished_episodes]
    if state is not None:
        state.wait_for_everyone()  # everyone has the same to-do list before anyone stages an episode
    if num_shards is not None:
        todo = [i for i in todo if i % num_shards == shard_index]
    t0 = time.perf_counter()
    if state is not None:
        with state.split_between_processes(todo) as mine:
            frames = _run(list(mine), model, input, output, ds.fps, seed, guidance, t_hash, device, threads,
                          1, progress and is_main)
        state.wait_for_everyone()
    else:
        frames = _run(todo, model, input, output, ds.fps, seed, guidance, t_hash, device, threads, workers, progress)
    elapsed = time.perf_counter() - t0
    if num_shards not in (None, 1):
        missing = sorted(set(range(len(ds))) - writer.finished_episodes)
        # other shards still running: the one that finishes last (or a call without shard arguments) closes
        if missing or not held.alone():
            return _report(output, header, len(todo), frames, elapsed, closed=False, waiting_for=len(missing))
    report = _report(output, header, len(todo), frames, elapsed, closed=is_main)
    if is_main:
        writer.close()
        if frames:  # a resumed run that had nothing left to convert keeps the timing of the one that did
            write_json(report, output / REPORT_FILE)
    return report


def _run(todo, model, input, output, fps, seed, guidance, t_hash, device, threads, workers, progress) -> int:
    jobs = [(str(model), str(input), str(output), fps, i, seed, guidance, t_hash, device, threads) for i in todo]
    bar = tqdm(total=len(jobs), desc="convert", unit="episode", disable=not progress)
    frames, pool = 0, None
    if workers > 1 and len(jobs) > 1:
        # workers end with this process: a rerun after a kill -9 never races one staging the same episode
        pool = mp.get_context("spawn").Pool(min(workers, len(jobs)), initializer=exit_with_parent,
                                            initargs=(os.getpid(),))
        results = pool.imap_unordered(_work, jobs)
    else:
        results = map(_work, jobs)
    try:
        for n in results:
            frames += n
            bar.update(1)
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    return frames


def _report(output, header, converted, frames, elapsed, closed=True, waiting_for=0) -> dict:
    return {"output": str(output), "translator_hash": header["translator_hash"],
            "episodes": header["input_episodes"], "converted_now": converted, "frames_now": frames,
            "elapsed_s": None if elapsed is None else round(elapsed, 2),
            "frames_per_second": round(frames / elapsed, 2) if elapsed and frames else None,
            "closed": closed, "episodes_left": waiting_for}
