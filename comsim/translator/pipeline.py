"""TranslatorPipeline: sim video + actions -> pseudo-real video.

A folder written by ``save_pretrained`` holds everything needed to sample offline:

    translator.json        camera, window (num_frames, resolution), action_dim, controls, provenance,
                           sampling (the SamplingParams that calls use unless told otherwise)
    transformer/           CompositionalVideoDiT (config.json + safetensors)
    scheduler/             FlowMatchEulerDiscreteScheduler config (timesteps, sigmas and step of the loop)
    codec.json (+ vae/)    the codec; a VAE's weights are copied in
    action_stats.json      action normalization (raw actions in, normalized inside)

Sampling runs the saved scheduler's timesteps and its own ``step`` (diffusers style): with
FlowMatchEulerDiscreteScheduler, Euler steps of the flow ODE dx/dsigma = v from sigma=1 (noise)
to 0, v composed from the unconditional, action-only and sim-only predictions (guidance.py).
Episodes longer than the window are generated in overlapping windows: each new window's
overlap frames are pinned to the previous result, re-noised with the same noise at every
step, and the overlap is cross-faded linearly, so no seam shows.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from comsim.config import PRECISIONS
from comsim.episode import Episode, Provenance, resize_frames
from comsim.errors import ComSimError
from comsim.io.files import weights_hash
from comsim.io.keys import control_key, sim_key
from comsim.translator.codec import load_codec
from comsim.translator.data import ActionNormalizer, encode_condition, tensor_to_video, video_to_tensor
from comsim.translator.guidance import guided_velocity
from comsim.translator.model import CompositionalVideoDiT
from comsim.translator.sampling import DEFAULT_SAMPLING, SamplingParams


class TranslatorMismatchError(ComSimError, ValueError):
    """A checkpoint or an input does not fit what the model was built for."""


def sampling_defaults(directory: str | Path) -> SamplingParams:
    """The sampling settings a saved pipeline asks for (its training config's ``sampling``), read
    from translator.json without loading weights."""
    meta = json.loads((Path(directory) / "translator.json").read_text())
    return own_sampling(meta.get("sampling"))


def own_sampling(saved: dict | SamplingParams | None) -> SamplingParams:
    """A pipeline's own SamplingParams from what translator.json records (every field filled)."""
    if isinstance(saved, SamplingParams):
        return saved.resolved(DEFAULT_SAMPLING)
    unknown = set(saved or {}) - set(DEFAULT_SAMPLING.to_dict())
    if unknown:
        raise ValueError(f"sampling has unknown keys {sorted(unknown)}; expected {sorted(DEFAULT_SAMPLING.to_dict())}")
    return SamplingParams(**(saved or {})).resolved(DEFAULT_SAMPLING)


# Output heads a saved model may name that this version does not have (what replaced each). At 0 (off) they are
# ignored when loading.
REMOVED_MODEL_OPTIONS = {"local_affine": "the per-pixel head, model.pixel_head, replaced it",
                         "refine_channels": "the per-pixel head, model.pixel_head, replaced it"}


class TranslatorPipeline:
    final_step_to_x0 = True  # a clean-frame model's last Euler step lands on its prediction (see _timesteps)

    def __init__(self, transformer: CompositionalVideoDiT, codec, scheduler: FlowMatchEulerDiscreteScheduler,
                 normalizer: ActionNormalizer, camera: str = "front", num_frames: int = 8,
                 resolution: tuple[int, int] = (32, 32), controls: tuple[str, ...] = (), fps: float = 10.0,
                 provenance: dict | None = None, sampling: dict | SamplingParams | None = None):
        self.transformer, self.codec, self.scheduler, self.normalizer = transformer, codec, scheduler, normalizer
        self.camera, self.num_frames, self.resolution = camera, int(num_frames), tuple(resolution)
        self.controls, self.fps, self.provenance = tuple(controls), fps, dict(provenance or {})
        self.sampling = own_sampling(sampling)
        self._check_consistency()

    # -- consistency -----------------------------------------------------------------------
    def info(self) -> dict:
        return {"camera": self.camera, "num_frames": self.num_frames, "resolution": list(self.resolution),
                "controls": list(self.controls), "action_dim": self.normalizer.dim, "fps": self.fps,
                "provenance": self.provenance, "sampling": self.sampling.to_dict()}

    def _check_consistency(self):
        mc = self.transformer.config
        t, h, w = self.codec.latent_size(self.num_frames, *self.resolution)
        want = {"in_channels": self.codec.latent_channels,
                "sim_channels": self.codec.latent_channels + 3 * len(self.controls),
                "action_dim": self.normalizer.dim, "num_frames": t, "sample_size": (h, w),
                "actions_per_latent_frame": self.codec.temporal_factor,
                "causal_first_frame": bool(self.codec.causal_first_frame)}
        for key, value in want.items():
            got = tuple(mc[key]) if isinstance(mc[key], (list, tuple)) else mc[key]
            if got != value:
                raise TranslatorMismatchError(
                    f"transformer.{key}={got} but the codec/window/action stats need {value} "
                    f"(num_frames={self.num_frames}, resolution={self.resolution}, codec={self.codec.config()})")

    # -- save / load -----------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the folder atomically (to ``<dir>.tmp``, then rename)."""
        directory = Path(directory)
        for d in (directory, directory.with_name(directory.name + ".tmp")):
            # replace only a pipeline folder written here before (or its temporary), never a user's folder
            if d.exists() and not (d.is_dir() and ((d / "translator.json").is_file() or not any(d.iterdir())
                                                   or d.name.endswith(".tmp") and (d / "transformer").is_dir())):
                raise TranslatorMismatchError(f"{d}: exists and is not a translator pipeline folder; "
                                              "save_pretrained replaces only its own folders (choose another path)")
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.transformer.save_pretrained(tmp / "transformer", safe_serialization=True)
        self.scheduler.save_pretrained(tmp / "scheduler")
        self.codec.save_pretrained(tmp)
        (tmp / "action_stats.json").write_text(json.dumps(self.normalizer.to_dict(), indent=2))
        (tmp / "translator.json").write_text(json.dumps(self.info(), indent=2, default=str))
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu",
                        expect: dict | None = None) -> "TranslatorPipeline":
        """Load a saved pipeline. ``expect`` ({"action_dim": 8, "camera": "front", ...}) is checked
        against the saved fields before any weight is read."""
        directory = Path(directory)
        meta_path = directory / "translator.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory} is not a translator pipeline folder (no translator.json); "
                                    "training writes one to <output_dir>/final")
        meta = json.loads(meta_path.read_text())
        for key, value in (expect or {}).items():
            got = meta.get(key)
            norm = lambda v: list(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
            if norm(got) != norm(value):
                raise TranslatorMismatchError(f"{directory}: this translator has {key}={got}, expected {value}")
        model_config = json.loads((directory / "transformer" / "config.json").read_text())
        for option, replacement in REMOVED_MODEL_OPTIONS.items():
            if model_config.get(option):
                raise TranslatorMismatchError(
                    f"{directory / 'transformer' / 'config.json'}: {option}={model_config[option]} is an output head "
                    f"this version no longer has ({replacement}); retrain with configs/translator/tiny_lab.yaml, or "
                    "load it with the ComSim version that trained it")
        normalizer = ActionNormalizer.from_dict(json.loads((directory / "action_stats.json").read_text()))
        pipe = cls(CompositionalVideoDiT.from_pretrained(directory / "transformer"), load_codec(directory),
                   FlowMatchEulerDiscreteScheduler.from_pretrained(directory / "scheduler"), normalizer,
                   camera=meta["camera"], num_frames=meta["num_frames"], resolution=tuple(meta["resolution"]),
                   controls=tuple(meta.get("controls", ())), fps=meta.get("fps", 10.0),
                   provenance=meta.get("provenance"), sampling=meta.get("sampling"))
        weights = directory / "transformer" / "diffusion_pytorch_model.safetensors"
        pipe.checkpoint_hash = weights_hash(weights) if weights.is_file() else None
        return pipe.to(device)

    def to(self, device=None, dtype=None) -> "TranslatorPipeline":
        self.transformer.to(device) if dtype is None else self.transformer.to(device, dtype)
        self.codec.to(device=device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    # -- inputs ----------------------------------------------------------------------------
    def check_inputs(self, sim_video, actions, controls=None, sampling: SamplingParams | None = None):
        """Validate everything before any compute; returns batched (sim, actions, controls), the overlap."""
        sampling = (sampling or SamplingParams()).resolved(self.sampling)
        sim = np.asarray(sim_video)
        if sim.dtype != np.uint8 or sim.ndim not in (4, 5) or sim.shape[-1] != 3:
            raise ValueError(f"sim_video must be uint8 (T, H, W, 3) or (B, T, H, W, 3), got {sim.dtype} {sim.shape}")
        batched = sim.ndim == 5
        sim = sim if batched else sim[None]
        B, T, H, W, _ = sim.shape
        if (H, W) != self.resolution:
            raise ValueError(f"sim_video frames are {H}x{W} (H x W) but this translator works at "
                             f"{self.resolution[0]}x{self.resolution[1]}: resize first, e.g. "
                             f"comsim.episode.resize_frames(frames, {self.resolution})")
        act = np.asarray(actions, dtype=np.float32)
        if act.ndim != (3 if batched else 2):
            raise ValueError(f"actions must be {'(B, T, A)' if batched else '(T, A)'} to go with sim_video "
                             f"{tuple(np.shape(sim_video))}, got shape {act.shape}")
        act = act if batched else act[None]
        A = self.normalizer.dim
        if act.shape[-1] != A:
            raise ValueError(f"actions have {act.shape[-1]} values per frame; this translator expects action_dim={A} "
                             f"(7 joint targets + gripper for the Panda)")
        if act.shape[:2] != (B, T):
            raise ValueError(f"actions cover {act.shape[1]} frames (batch {act.shape[0]}) but sim_video has "
                             f"{T} frames (batch {B}): one action per frame is expected")
        if not np.isfinite(act).all():
            raise ValueError("actions contain NaN or inf")
        ctrl = []
        for name in self.controls:
            if controls is None or name not in controls:
                raise ValueError(f"this translator needs control video {name!r} (controls={{'{name}': frames}})")
            c = np.asarray(controls[name])
            c = c if batched else c[None]
            if c.shape != sim.shape or c.dtype != np.uint8:
                raise ValueError(f"controls[{name!r}] must be uint8 {sim.shape}, got {c.dtype} {c.shape}")
            ctrl.append(c)
        if sampling.strength < 1.0 and self.transformer.config.in_channels > self.transformer.config.sim_channels:
            raise ValueError("strength < 1 starts from the sim latents, which need as many channels as the output")
        self.codec.check_frames(self.num_frames, "num_frames")
        ov = self.resolve_overlap(sampling.overlap)
        if T > self.num_frames and not 0 < ov < self.num_frames:
            raise ValueError(f"overlap must be in [1, num_frames={self.num_frames}), got {ov}")
        if T > self.num_frames and self.codec.temporal_factor > 1 and (ov - 1) % self.codec.temporal_factor:
            raise ValueError(f"overlap={ov}: with a video VAE the overlap must be 1 + "
                             f"{self.codec.temporal_factor}*k frames")
        return batched, sim, act, ctrl, ov

    def default_overlap(self) -> int:
        r = self.codec.temporal_factor
        half = max(1, self.num_frames // 2)
        return half if r == 1 else 1 + r * max(0, (half - 1) // r)

    def resolve_overlap(self, overlap: int | None = None) -> int:
        """``overlap``, else the pipeline's own sampling setting, else half a window."""
        own = self.sampling.overlap
        return int(overlap) if overlap is not None else int(own) if own is not None else self.default_overlap()

    # -- sampling --------------------------------------------------------------------------
    def _timesteps(self, num_steps: int, strength: float) -> torch.Tensor:
        """Set the scheduler up for one window and return the timesteps to run: all ``num_steps``
        at strength 1; a strength < 1 runs only the last ones (the scheduler starts at that index)."""
        if self.transformer.config.prediction_type == "sample" and self.final_step_to_x0:
            # noise levels 1, (n-1)/n, ..., 1/n, then 0: the last Euler step, from 1/n to 0, lands on the model's
            # clean-frame prediction itself. The scheduler's own spacing ends 1/1000 above 0, so its last step
            # moved 2% of the way to the newest prediction and the last model call was wasted.
            self.scheduler.set_timesteps(sigmas=[1.0 - i / num_steps for i in range(num_steps)], device=self.device)
        else:
            self.scheduler.set_timesteps(num_steps, device=self.device)
        start = num_steps - min(num_steps, max(1, int(round(num_steps * strength))))
        self.scheduler.set_begin_index(start)
        return self.scheduler.timesteps[start:]

    @torch.no_grad()
    def _sample_window(self, sim_lat, actions, noise, num_steps, w_action, w_sim, strength, known=None,
                       generator=None, precision: str = "fp32", camera_shift=None):
        """Denoise one window with the scheduler; ``known`` (B, C, k, h, w) pins the first k latent frames;
        ``camera_shift`` (B, T, 2) px or None."""
        model, scheduler = self.transformer, self.scheduler
        dtype = next(model.parameters()).dtype
        # 1. timesteps, and the sigma (noise level) of each
        timesteps = self._timesteps(num_steps, strength)
        sigmas = scheduler.sigmas[scheduler.begin_index:]
        # 2. initial latents: pure noise, or the sim latents noised to the first sigma (strength < 1)
        C = model.config.in_channels
        x = noise * sigmas[0] + (1 - sigmas[0]) * sim_lat[:, :C] if strength < 1 else noise.clone()
        # 3. denoising loop
        for i, t in enumerate(timesteps):
            # 3a. overlap with the previous window: its result, re-noised with the same noise
            if known is not None:
                k, s = known.shape[2], float(sigmas[i])
                x[:, :, :k] = (1 - s) * known + s * noise[:, :, :k]
            # 3b. the composed velocity of the three conditions, in one model call (bf16: the model's
            #     matmuls under autocast; the composition and the step stay float32)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                v = guided_velocity(model, x.to(dtype), t.expand(x.shape[0]).float(), actions.to(dtype),
                                    sim_lat.to(dtype), w_action, w_sim, camera_shift)
            # 3c. the scheduler's step (an Euler step of the flow ODE for FlowMatchEulerDiscreteScheduler)
            x = scheduler.step(v, t, x, generator=generator, return_dict=False)[0]
        return x

    @torch.no_grad()
    def __call__(self, sim_video, actions, sampling: SamplingParams | None = None, seed: int = 0,
                 controls: dict | None = None, progress: bool = False, precision: str = "fp32",
                 camera_shift=None) -> np.ndarray:
        """Translate ``sim_video`` uint8 (T, H, W, 3) [or (B, T, H, W, 3)] with raw ``actions`` (T, A)
        [or (B, T, A)] into uint8 pseudo-real frames of the same shape.

        Args:
            sampling: SamplingParams: guidance weights w_action, w_sim (1, 0: action-only; 0, 1:
                sim-only), num_steps (Euler steps at strength 1), strength (< 1 starts from the sim
                video noised to that level, SDEdit), overlap (frames shared by consecutive windows of
                a long episode; each frame costs about num_frames / (num_frames - overlap) windows).
                None fields: this pipeline's own settings, saved from its training config (overlap:
                else half a window).
            seed: the noise seed; the same seed gives the same frames.
            controls: {name: uint8 video} for a translator trained with control channels.
            precision: fp32, or bf16 (the transformer under torch.autocast: on CPUs with AMX /
                AVX512-BF16 ~0.85 of the float32 time, frames within a few grey levels).
            camera_shift: (T, 2) [or (B, T, 2)] px, the camera's image shift per frame as the twin rendered it
                (a replayed real episode whose camera moved: ``camera_shifts``); None: 0 (a factory episode, at
                the calibrated camera). Used by a model whose plate follows the camera, ignored otherwise.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
        sampling = (sampling or SamplingParams()).resolved(self.sampling)
        batched, sim, act, ctrl, overlap = self.check_inputs(sim_video, actions, controls, sampling)
        num_steps, w_action, w_sim, strength = sampling.num_steps, sampling.w_action, sampling.w_sim, sampling.strength
        B, L = sim.shape[:2]
        N = self.num_frames
        if L < N:  # pad short episodes by holding the last frame and action
            pad = N - L
            sim = np.concatenate([sim, np.repeat(sim[:, -1:], pad, 1)], 1)
            act = np.concatenate([act, np.repeat(act[:, -1:], pad, 1)], 1)
            ctrl = [np.concatenate([c, np.repeat(c[:, -1:], pad, 1)], 1) for c in ctrl]
        T = sim.shape[1]
        dev = self.device
        shift = None
        if camera_shift is not None and getattr(self.transformer.config, "plate_follows_camera", False):
            shift = torch.as_tensor(np.asarray(camera_shift, np.float32))
            shift = shift if shift.dim() == 3 else shift[None].expand(B, -1, -1)
            if tuple(shift.shape) != (B, L, 2):
                raise ValueError(f"camera_shift: expected ({L}, 2) px per frame, got {tuple(np.shape(camera_shift))}")
            if L < N:
                shift = torch.cat([shift, shift[:, -1:].expand(B, N - L, 2)], 1)
        sim_px = torch.cat([video_to_tensor(v) for v in [sim] + ctrl], dim=1)  # (B, Cs_px, T, H, W)
        act_n = torch.from_numpy(self.normalizer.normalize(act))
        gen = torch.Generator().manual_seed(int(seed))
        per_frame = self.codec.temporal_factor == 1
        t_lat, h, w = self.codec.latent_size(N, *self.resolution)
        C = self.transformer.config.in_channels
        if per_frame:  # one noise tensor for the episode: overlapping windows share their noise
            all_noise = torch.randn((B, C, T, h, w), generator=gen)

        starts = list(range(0, max(T - N, 0) + 1, N - overlap)) if T > N else [0]
        if starts[-1] != T - N:
            starts.append(T - N)
        out = torch.zeros(B, 3, T, *self.resolution)
        done = 0  # frames [0, done) of `out` are final
        it = starts
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(starts, desc="windows")
        for s in it:
            sl = slice(s, s + N)
            sim_lat = encode_condition(self.codec, sim_px[:, :, sl].to(dev))
            noise = all_noise[:, :, sl] if per_frame else torch.randn((B, C, t_lat, h, w), generator=gen)
            known, k_px = None, done - s
            if k_px > 0:
                if per_frame:
                    known = self.codec.encode(out[:, :, s:done].to(dev))
                else:  # causal video VAE: the first latent frames depend only on the first pixel frames
                    ref = torch.cat([out[:, :, s:done], sim_px[:, :3, done:s + N]], dim=2)
                    known = self.codec.encode(ref.to(dev))[:, :, :1 + (k_px - 1) // self.codec.temporal_factor]
            lat = self._sample_window(sim_lat, act_n[:, sl].to(dev), noise.to(dev), num_steps, w_action,
                                      w_sim, strength, known, generator=gen, precision=precision,
                                      camera_shift=None if shift is None else shift[:, sl])
            video = self.codec.decode(lat).float().cpu()
            if k_px > 0:  # linear cross-fade from the previous result to this window over the overlap
                ramp = torch.arange(1, k_px + 1, dtype=torch.float32) / (k_px + 1)
                ramp = ramp.view(1, 1, -1, 1, 1)
                out[:, :, s:done] = (1 - ramp) * out[:, :, s:done] + ramp * video[:, :, :k_px]
                out[:, :, done:s + N] = video[:, :, k_px:]
            else:
                out[:, :, sl] = video
            done = s + N
        frames = tensor_to_video(out)[:, :L]
        return frames if batched else frames[0]

    def translate_episode(self, episode, sampling: SamplingParams | None = None, seed: int = 0,
                          extra: dict | None = None, camera_shift=None, **kwargs):
        """A pseudo-real Episode from a sim or paired Episode (its ``<camera>_sim`` frames and actions).

        The one place a pseudo-real episode is made (``comsim convert`` and the demo's held-out
        episodes call it). The sim (and control) frames are resized to the translator's resolution
        and translated; the result holds the episode's own frames, as they are, with ``<camera>``
        replaced by the generated ones, and provenance: source ``pseudo_real``, this translator's
        hash, ``guidance`` = the SamplingParams as sampled, every field filled (and ``precision``
        when not fp32), the seed, and in ``extra`` the sim episode's seed and provenance (plus ``extra``).
        ``camera_shift``: a replayed real episode's per-frame camera shift (``comsim.translator.data.camera_shifts``
        of its paired dataset), for a model whose plate follows the camera; None for a factory episode.
        """
        key = sim_key(self.camera)
        if key not in episode.frames:
            raise ValueError(f"episode has no {key!r} frames (it has {sorted(episode.frames)})")
        sim = resize_frames(episode.frames[key], self.resolution)
        controls = {c: resize_frames(episode.frames[control_key(self.camera, c)], self.resolution) for c in self.controls
                    if control_key(self.camera, c) in episode.frames} or None
        sampling = (sampling or SamplingParams()).resolved(self.sampling)
        sampling.overlap = self.resolve_overlap(sampling.overlap)
        frames = self(sim, episode.action, sampling, seed=seed, controls=controls, camera_shift=camera_shift, **kwargs)
        src = episode.provenance
        prov = Provenance(source="pseudo_real", task=src.task, seed=int(seed), twin_spec_hash=src.twin_spec_hash,
                          translator_hash=getattr(self, "checkpoint_hash", None),
                          guidance={**sampling.to_dict(),
                                    **({"precision": kwargs["precision"]} if kwargs.get("precision", "fp32") != "fp32"
                                       else {})},
                          extra={"sim_seed": src.seed, "sim_provenance": src.to_dict(), **(extra or {})})
        return Episode(frames={**episode.frames, self.camera: frames}, action=episode.action, state=episode.state,
                       fps=episode.fps, timestamps=episode.timestamps, task=episode.task,
                       success=episode.success, provenance=prov, extra=dict(episode.extra))
