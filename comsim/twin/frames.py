"""Calibration frames from a folder, checked file by file.

Layout (as ../shared/real/franka_easyhec):

    color/NNNNNN.png          RGB frames, all the same size
    mask/NNNNNN.png           robot masks (> 127 = robot), same size as the frames; or instead
    background.png            a robot-free frame of the same camera (the arm parked out of
                              view): masks are then derived (``calibrate.calibrate_folder``)
    qpos/NNNNNN.txt           7 arm joint angles (rad), optionally + 2 finger positions (m)
    K.txt                     3x3 intrinsics at the frames' size (or camera_intrinsics.json)
    dist.txt                  optional OpenCV distortion (k1 k2 p1 p2 [k3 ...])
    camera_intrinsics.json    optional instead of K.txt/dist.txt: {"K": 3x3 or [fx,fy,cx,cy],
                              "dist": [...], "width": W, "height": H}
    checkerboard/             optional instead of K: board images + board.json
                              {"inner_corners": [cols, rows], "square_size_m": s}
    init_T_cam_from_base.txt  optional rough 4x4 starting pose (metres, OpenCV camera)

Distorted frames are undistorted here (masks stay soft after the resampling), so every
later stage is pinhole. Every error names the file that is wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from comsim.errors import ComSimError
from comsim.io.files import read_json_object
from comsim.sim.camera import as_K, as_rigid

IMAGE_EXTS = (".png", ".jpg", ".jpeg")


class CalibrationDataError(ComSimError, ValueError):
    pass


@dataclass
class CalibrationFrames:
    names: list[str]  # file stems, e.g. "000003"
    images: np.ndarray  # uint8 (N, H, W, 3) RGB, undistorted
    masks: np.ndarray  # float32 (N, H, W) in [0, 1], undistorted
    joints: np.ndarray  # (N, 7) arm joint angles
    fingers: np.ndarray  # (N, 2) finger joint positions (m)
    K: np.ndarray  # (fx, fy, cx, cy) at W x H (pinhole, after undistortion)
    dist: np.ndarray | None = None  # the distortion that was removed
    init_T: np.ndarray | None = None
    folder: Path | None = None
    valid: np.ndarray | None = None  # (H, W) or (N, H, W): where the masks are known (None: everywhere)
    background: np.ndarray | None = None  # uint8 (H, W, 3) robot-free frame, undistorted (folders without masks)

    @property
    def size(self) -> tuple[int, int]:
        return self.images.shape[2], self.images.shape[1]


def read_image(path: Path, gray: bool = False) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR)
    if img is None:
        raise CalibrationDataError(f"{path}: not a readable image")
    return img if gray else img[..., ::-1].copy()


def check_K_fits(K, width: int, height: int, where: str) -> np.ndarray:
    """K (fx, fy, cx, cy) for a W x H image: principal point inside, plausible focal length."""
    try:
        k = as_K(K)
    except ValueError as e:
        raise CalibrationDataError(f"{where}: {e}") from None
    fx, fy, cx, cy = k
    if not (0.2 * width < cx < 0.8 * width and 0.2 * height < cy < 0.8 * height):
        raise CalibrationDataError(
            f"{where}: principal point ({cx:.1f}, {cy:.1f}) does not fit {width}x{height} images "
            "(is K for another resolution?)")
    if not (0.2 * width < fx < 20 * width and 0.2 * height < fy < 20 * height):
        raise CalibrationDataError(f"{where}: focal lengths ({fx:.1f}, {fy:.1f}) implausible for {width}x{height} images")
    return k


def read_numbers(path: Path) -> np.ndarray:
    """A whitespace-separated table of numbers (K.txt, dist.txt, qpos/*.txt); anything else is a
    CalibrationDataError naming the file."""
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=1)
    except (ValueError, UnicodeDecodeError) as e:
        first = (str(e).splitlines() or [""])[0]
        raise CalibrationDataError(f"{path}: expected whitespace-separated numbers ({first})") from None


def read_joints(path: Path) -> tuple[np.ndarray, np.ndarray]:
    q = read_numbers(path).reshape(-1)
    if len(q) not in (7, 9):
        raise CalibrationDataError(f"{path}: expected 7 arm joint angles (+ 2 finger positions), got {len(q)} numbers")
    if not np.all(np.isfinite(q)):
        raise CalibrationDataError(f"{path}: joint values must be finite")
    return q[:7], (q[7:9] if len(q) == 9 else np.zeros(2))


def _intrinsics(folder: Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray | None]:
    js, ktxt, board = folder / "camera_intrinsics.json", folder / "K.txt", folder / "checkerboard"
    dist = None
    if js.is_file():
        d = read_json_object(js, CalibrationDataError, "a JSON object with K (and width, height, dist)")
        if "K" not in d:
            raise CalibrationDataError(f"{js}: missing field 'K'")
        if "width" in d and (d["width"], d["height"]) != (width, height):
            raise CalibrationDataError(f"{js}: intrinsics are for {d['width']}x{d['height']}, "
                                       f"the frames are {width}x{height}")
        K, where = d["K"], str(js)
        try:
            dist = np.asarray(d.get("dist") or [], np.float64).reshape(-1) if d.get("dist") is not None else None
        except (TypeError, ValueError):
            raise CalibrationDataError(f"{js}: dist: expected a list of numbers, got {d['dist']!r}") from None
    elif ktxt.is_file():
        K, where = read_numbers(ktxt), str(ktxt)
    elif board.is_dir():
        K, dist = intrinsics_from_checkerboard(board)
        where = str(board)
    else:
        raise CalibrationDataError(f"{ktxt}: file not found (nor camera_intrinsics.json, nor checkerboard/)")
    if (folder / "dist.txt").is_file():
        dist = read_numbers(folder / "dist.txt").reshape(-1)
    if dist is not None and (len(dist) not in (0, 4, 5, 8, 12, 14) or not np.all(np.isfinite(dist))):
        src = folder / "dist.txt" if (folder / "dist.txt").is_file() else js
        raise CalibrationDataError(f"{src}: dist: expected 4, 5, 8, 12 or 14 finite OpenCV distortion coefficients, "
                                   f"got {dist.tolist()}")
    K = check_K_fits(K, width, height, where)
    if dist is not None and (len(dist) == 0 or not np.any(dist)):
        dist = None
    return K, dist


def undistort_maps(K, dist, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Maps for cv2.remap: pinhole image (same K) from a distorted one."""
    Km = np.array([[K[0], 0, K[2]], [0, K[1], K[3]], [0, 0, 1]])
    return cv2.initUndistortRectifyMap(Km, np.asarray(dist, np.float64), None, Km, (width, height), cv2.CV_32FC1)


def undistort(img: np.ndarray, maps) -> np.ndarray:
    return cv2.remap(img, maps[0], maps[1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def load_calibration_folder(folder: str | Path) -> CalibrationFrames:
    folder = Path(folder)
    color_dir, mask_dir, qpos_dir = folder / "color", folder / "mask", folder / "qpos"
    bg_path = next((folder / ("background" + e) for e in IMAGE_EXTS if (folder / ("background" + e)).is_file()),
                   None)
    with_masks = mask_dir.is_dir() or bg_path is None
    for d in (color_dir, mask_dir, qpos_dir) if with_masks else (color_dir, qpos_dir):
        if not d.is_dir():
            raise CalibrationDataError(f"{d}: folder not found (expected color/, mask/ (or background.png), qpos/)")
    colors = sorted(p for p in color_dir.iterdir() if p.suffix.lower() in IMAGE_EXTS)
    if not colors:
        raise CalibrationDataError(f"{color_dir}: no images")
    names, images, masks, joints, fingers = [], [], [], [], []
    for p in colors:
        img = read_image(p)
        if images and img.shape != images[0].shape:
            raise CalibrationDataError(f"{p}: {img.shape[1]}x{img.shape[0]}, but {colors[0]} is "
                                       f"{images[0].shape[1]}x{images[0].shape[0]}")
        if with_masks:
            mpath = next((mask_dir / (p.stem + e) for e in IMAGE_EXTS if (mask_dir / (p.stem + e)).is_file()),
                         None)
            if mpath is None:
                raise CalibrationDataError(f"{mask_dir / (p.stem + '.png')}: mask for {p.name} not found")
            m = read_image(mpath, gray=True)
            if m.shape != img.shape[:2]:
                raise CalibrationDataError(f"{mpath}: mask is {m.shape[1]}x{m.shape[0]}, its frame {p} is "
                                           f"{img.shape[1]}x{img.shape[0]}")
        else:
            m = np.zeros(img.shape[:2], np.uint8)  # placeholder: derived later from the background
        qpath = qpos_dir / (p.stem + ".txt")
        if not qpath.is_file():
            raise CalibrationDataError(f"{qpath}: joint angles for {p.name} not found")
        q, f = read_joints(qpath)
        names.append(p.stem)
        images.append(img)
        masks.append((m > 127).astype(np.float32))
        joints.append(q)
        fingers.append(f)
    H, W = images[0].shape[:2]
    K, dist = _intrinsics(folder, W, H)
    background = None
    if not with_masks:
        background = read_image(bg_path)
        if background.shape != images[0].shape:
            raise CalibrationDataError(f"{bg_path}: {background.shape[1]}x{background.shape[0]}, the frames are "
                                       f"{W}x{H}")
    if dist is not None:
        maps = undistort_maps(K, dist, W, H)
        images = [undistort(i, maps) for i in images]
        masks = [undistort(m, maps) for m in masks]
        background = None if background is None else undistort(background, maps)
    init_T = None
    tpath = folder / "init_T_cam_from_base.txt"
    if tpath.is_file():
        try:
            init_T = as_rigid(read_numbers(tpath))
        except ValueError as e:
            raise CalibrationDataError(f"{tpath}: {e}") from None
    return CalibrationFrames(names=names, images=np.stack(images), masks=np.stack(masks), joints=np.stack(joints),
                             fingers=np.stack(fingers), K=K, dist=dist, init_T=init_T, folder=folder,
                             background=background)


def intrinsics_from_checkerboard(folder, inner_corners=None, square_size_m=None) -> tuple[np.ndarray, np.ndarray]:
    """K (fx, fy, cx, cy) and OpenCV distortion from checkerboard images.

    ``folder`` holds the images and, unless given here, ``board.json`` with
    ``{"inner_corners": [cols, rows], "square_size_m": s}``.
    """
    folder = Path(folder)
    meta = folder / "board.json"
    if inner_corners is None or square_size_m is None:
        if not meta.is_file():
            raise CalibrationDataError(f"{meta}: file not found (inner_corners and square_size_m of the board)")
        b = read_json_object(meta, CalibrationDataError, "a JSON object with inner_corners and square_size_m")
        try:
            inner_corners, square_size_m = b["inner_corners"], b["square_size_m"]
        except KeyError as e:
            raise CalibrationDataError(f"{meta}: missing field {e}") from None
    try:
        cols, rows = (int(v) for v in inner_corners)
        square_size_m = float(square_size_m)
    except (TypeError, ValueError):
        raise CalibrationDataError(f"{meta}: expected inner_corners [cols, rows] and square_size_m in metres, got "
                                   f"{inner_corners!r}, {square_size_m!r}") from None
    if cols < 2 or rows < 2 or not np.isfinite(square_size_m) or square_size_m <= 0:
        raise CalibrationDataError(f"{meta}: expected at least 2x2 inner corners and a square size > 0 m, got "
                                   f"{inner_corners!r}, {square_size_m!r}")
    grid = np.zeros((cols * rows, 3), np.float32)
    grid[:, :2] = np.mgrid[0:cols, 0:rows].T.reshape(-1, 2) * float(square_size_m)
    obj, img, size = [], [], None
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    for p in paths:
        gray = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        if gray is None:
            raise CalibrationDataError(f"{p}: not a readable image")
        if size is not None and gray.shape[::-1] != size:
            raise CalibrationDataError(f"{p}: {gray.shape[1]}x{gray.shape[0]}, other board images are {size[0]}x{size[1]}")
        size = gray.shape[::-1]
        ok, corners = cv2.findChessboardCorners(gray, (cols, rows))
        if not ok:
            continue
        corners = cv2.cornerSubPix(gray, corners, (5, 5), (-1, -1),
                                   (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 50, 1e-4))
        obj.append(grid)
        img.append(corners)
    if len(obj) < 3:
        raise CalibrationDataError(f"{folder}: the {cols}x{rows} board was found in {len(obj)} of {len(paths)} "
                                   "images; at least 3 are needed")
    rms, Km, dist, _, _ = cv2.calibrateCamera(obj, img, size, None, None)
    return np.array([Km[0, 0], Km[1, 1], Km[0, 2], Km[1, 2]]), dist.reshape(-1)
