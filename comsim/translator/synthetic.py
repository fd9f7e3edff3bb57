"""Synthetic paired episodes: a learnable sim -> real problem where the action matters.

A planar two-link 'arm' hangs from the bottom centre of the image. Its shoulder and
elbow angles are action[0] and action[1] (absolute targets, radians), its gripper opening
is action[7] (1 = open). A box sits somewhere on the table. The SIM render is flat colours
on a flat backdrop; the REAL render of the same instant has a textured, vignetted backdrop,
other colours, a shadow under the arm, blur, a white-balance shift and sensor noise.
Everything but the noise is a deterministic function of (scene, action): sim -> real is
learnable, and the arm's place in the frame can be read off the action alone.

``arm_mask`` draws where the arm must be for given actions; ``detect_arm`` finds it in a
real-look frame by colour. ``arm_placement`` compares the two (IoU, centroid error).
"""
from __future__ import annotations

import numpy as np

from comsim.episode import Episode, Provenance
from comsim.io.keys import sim_key

BASE = np.array([0.5, 0.97])  # arm base, normalized (x, y), y down
LINKS = (0.40, 0.32)
WIDTH = 0.055  # link half-thickness, normalized
SIM = {"bg": (150, 160, 175), "arm": (235, 125, 35), "grip": (250, 220, 40)}
REAL = {"bg": (196, 172, 138), "arm": (62, 68, 86), "grip": (28, 28, 32)}
OBJECT_COLOURS = [(220, 60, 60), (60, 190, 80), (70, 110, 230), (200, 90, 210), (240, 170, 40), (60, 200, 200)]
SS = 4  # supersampling factor for anti-aliased drawing


def _grid(size: int):
    n = size * SS
    c = (np.arange(n) + 0.5) / n
    return np.meshgrid(c, c, indexing="xy")  # x (n, n), y (n, n)


def _segment_cover(px, py, a, b, half_width):
    ab = b - a
    t = np.clip(((px - a[0]) * ab[0] + (py - a[1]) * ab[1]) / max(float(ab @ ab), 1e-9), 0.0, 1.0)
    return np.hypot(px - (a[0] + t * ab[0]), py - (a[1] + t * ab[1])) < half_width


def arm_points(action: np.ndarray):
    """Shoulder, elbow, hand (normalized xy) and the gripper's finger segments for one action."""
    th1 = float(action[0])
    th2 = th1 + float(action[1])
    up1 = np.array([np.sin(th1), -np.cos(th1)])
    up2 = np.array([np.sin(th2), -np.cos(th2)])
    elbow = BASE + LINKS[0] * up1
    hand = elbow + LINKS[1] * up2
    side = np.array([-up2[1], up2[0]])
    opening = 0.03 + 0.05 * float(np.clip(action[7], 0.0, 1.0))
    fingers = [(hand + s * opening * side, hand + s * opening * side + 0.07 * up2) for s in (-1, 1)]
    return BASE, elbow, hand, fingers


def _arm_layers(action, px, py, offset=(0.0, 0.0)):
    base, elbow, hand, fingers = arm_points(action)
    o = np.asarray(offset)
    links = _segment_cover(px, py, base + o, elbow + o, WIDTH) | _segment_cover(px, py, elbow + o, hand + o, WIDTH * 0.8)
    side = fingers[1][0] - fingers[0][0]
    grip = _segment_cover(px, py, hand - 0.5 * side + o, hand + 0.5 * side + o, 0.018)
    for a, b in fingers:
        grip |= _segment_cover(px, py, a + o, b + o, 0.016)
    return links, grip


def _down(img: np.ndarray, size: int) -> np.ndarray:
    """Area-downsample a supersampled (n, n, ...) float image."""
    return img.reshape(size, SS, size, SS, *img.shape[2:]).mean(axis=(1, 3))


def arm_mask(actions: np.ndarray, size: int) -> np.ndarray:
    """Float (T, size, size) in [0, 1]: how much of each pixel the arm covers for these actions."""
    px, py = _grid(size)
    out = []
    for a in np.atleast_2d(actions):
        links, grip = _arm_layers(a, px, py)
        out.append(_down((links | grip).astype(np.float32), size))
    return np.stack(out)


def render(action: np.ndarray, scene: dict, size: int, look: str, rng: np.random.Generator | None = None):
    """One uint8 (size, size, 3) frame of ``scene`` with the arm at ``action`` in 'sim' or 'real' look."""
    px, py = _grid(size)
    box = (np.abs(px - scene["box_xy"][0]) < scene["box_half"]) & (np.abs(py - scene["box_xy"][1]) < scene["box_half"])
    links, grip = _arm_layers(action, px, py)
    colour = np.array(scene["box_colour"], np.float32)
    if look == "sim":
        img = np.empty(px.shape + (3,), np.float32)
        img[:] = SIM["bg"]
        img[box] = colour
        img[links] = SIM["arm"]
        img[grip] = SIM["grip"]
        return np.clip(_down(img, size), 0, 255).round().astype(np.uint8)
    # real look: texture + vignette, shaded box, shadow, other colours, blur, white balance, noise
    stripes = 0.06 * np.sin(2 * np.pi * (7 * px + 2.5 * py) + scene["phase"]) + 0.04 * np.sin(2 * np.pi * 19 * py)
    vignette = 1.0 - 0.35 * ((px - 0.5) ** 2 + (py - 0.45) ** 2)
    img = np.array(REAL["bg"], np.float32) * (1 + stripes)[..., None] * vignette[..., None]
    shade = 0.75 + 0.35 * (scene["box_xy"][1] + scene["box_half"] - py) / (2 * scene["box_half"])
    box_real = 0.8 * colour[::-1] * 0.4 + 0.8 * colour * 0.6  # colours bleed: a different palette
    img[box] = box_real * np.clip(shade[box], 0.6, 1.2)[:, None]
    sl, sg = _arm_layers(action, px, py, offset=(0.035, 0.03))
    img[sl | sg] *= 0.6  # shadow
    img[links] = np.array(REAL["arm"], np.float32) * (1 + 0.25 * np.sin(2 * np.pi * 3 * px[links]))[:, None]
    img[grip] = REAL["grip"]
    img = _down(img, size)
    k = np.array([0.25, 0.5, 0.25], np.float32)  # separable blur
    pad = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
    img = k[0] * pad[:-2, 1:-1] + k[1] * pad[1:-1, 1:-1] + k[2] * pad[2:, 1:-1]
    pad = np.pad(img, ((0, 0), (1, 1), (0, 0)), mode="edge")
    img = k[0] * pad[:, :-2] + k[1] * pad[:, 1:-1] + k[2] * pad[:, 2:]
    img = img * np.array([1.06, 1.0, 0.9], np.float32) + 6.0
    if rng is not None:
        img = img + rng.normal(0.0, 2.0, img.shape)
    return np.clip(img, 0, 255).round().astype(np.uint8)


def random_actions(length: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth absolute joint targets (T, 8): sums of slow sinusoids + a gripper that toggles."""
    t = np.arange(length, dtype=np.float64)[:, None]
    centre = rng.uniform([-0.7, -1.0, -1, -1, -1, -1, -1], [0.7, 1.0, 1, 1, 1, 1, 1])
    amp = rng.uniform(0.15, 0.5, size=(3, 7))
    freq = rng.uniform(0.03, 0.12, size=(3, 7))
    phase = rng.uniform(0, 2 * np.pi, size=(3, 7))
    joints = centre + sum(amp[i] * np.sin(2 * np.pi * freq[i] * t + phase[i]) for i in range(3))
    switches = np.cumsum(rng.random(length) < 0.06) + rng.integers(2)
    gripper = (switches % 2).astype(np.float64)[:, None]
    return np.concatenate([joints, gripper], axis=1).astype(np.float32)


def random_scene(rng: np.random.Generator) -> dict:
    return {"box_xy": rng.uniform([0.15, 0.15], [0.85, 0.6]), "box_half": float(rng.uniform(0.06, 0.12)),
            "box_colour": OBJECT_COLOURS[rng.integers(len(OBJECT_COLOURS))], "phase": float(rng.uniform(0, 6.3))}


def make_episode(actions: np.ndarray, scene: dict, size: int, camera: str = "front", fps: float = 10.0,
                 seed: int = 0) -> Episode:
    rng = np.random.default_rng(seed)
    real = np.stack([render(a, scene, size, "real", rng) for a in actions])
    sim = np.stack([render(a, scene, size, "sim") for a in actions])
    state = np.concatenate([actions[:1], actions[:-1]]).copy()  # the servo lags one frame
    state[:, 7] *= 0.08  # gripper opening in metres
    return Episode(frames={camera: real, sim_key(camera): sim}, action=actions, state=state, fps=fps,
                   task="synthetic arm", provenance=Provenance(source="lab", task="synthetic arm", seed=seed,
                                                               extra={"scene": {k: np.asarray(v).tolist() for k, v in scene.items()}}))


def make_synthetic_pairs(num_episodes: int = 48, length: int = 40, size: int = 32, seed: int = 0,
                         camera: str = "front") -> list[Episode]:
    """``num_episodes`` paired episodes: ``frames[camera]`` real look, ``frames[camera + '_sim']`` sim."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(num_episodes):
        actions = random_actions(length, rng)
        scene = random_scene(rng)
        episodes.append(make_episode(actions, scene, size, camera, seed=seed * 100003 + i))
    return episodes


def detect_arm(frames: np.ndarray) -> np.ndarray:
    """Bool (T, H, W): pixels of a real-look frame that have the arm's dark colours."""
    f = np.asarray(frames, np.float32)
    return f.max(axis=-1) < 110


def arm_placement(frames: np.ndarray, actions: np.ndarray) -> dict:
    """Does the arm in ``frames`` (real look, uint8 (T, H, W, 3)) sit where ``actions`` put it?

    Per frame: IoU between the detected arm pixels and the arm drawn from the action
    (covered > 50 %), and the distance in pixels between their centroids. Means over frames.
    """
    size = frames.shape[1]
    want = arm_mask(actions, size) > 0.5
    got = detect_arm(frames)
    inter = (want & got).sum(axis=(1, 2))
    union = (want | got).sum(axis=(1, 2))
    ious = inter / np.maximum(union, 1)
    yy, xx = np.mgrid[:size, :size]
    errs = []
    for w, g in zip(want, got):
        if g.sum() == 0 or w.sum() == 0:
            errs.append(float(size))  # nothing detected: as bad as the frame is wide
            continue
        errs.append(float(np.hypot(xx[w].mean() - xx[g].mean(), yy[w].mean() - yy[g].mean())))
    return {"iou": float(ious.mean()), "centroid_err_px": float(np.mean(errs))}
