"""bench/translator_error_budget.py: the regions' shares of the error add up, and the episode backdrop oracle
measures the frame-to-frame noise of a static backdrop (what no static background can draw)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from comsim.io.labels import seg_to_rgb

BENCH = Path(__file__).resolve().parents[1] / "bench" / "translator_error_budget.py"


@pytest.fixture(scope="module")
def bench():
    if not BENCH.is_file():
        pytest.skip("no bench/ folder next to the tests")
    spec = importlib.util.spec_from_file_location("translator_error_budget", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def episode(rng, backdrop, noise_std, T=30):
    """A static backdrop with sensor noise, a robot square moving across it (label 1, drawn white)."""
    labels = np.zeros((T, 32, 32), np.int64)
    frames = np.repeat(backdrop[None], T, 0).astype(np.float64)
    for t in range(T):
        x = t % 24
        labels[t, 10:18, x:x + 8] = 1
        frames[t, 10:18, x:x + 8] = 250.0
    frames = np.clip(frames + rng.normal(0, noise_std, frames.shape), 0, 255).round().astype(np.uint8)
    return frames, seg_to_rgb(labels).astype(np.uint8)


def test_the_backdrop_oracle_reads_the_sensor_noise_and_the_shares_add_up(bench):
    rng = np.random.default_rng(0)
    eps = [episode(rng, rng.uniform(60, 190, (32, 32, 3)), noise_std=5.0) for _ in range(3)]
    real, segs = [e[0] for e in eps], [e[1] for e in eps]
    oracle = bench.episode_backdrop_oracle(real, segs)
    assert oracle["backdrop_psnr"] == pytest.approx(20 * np.log10(255 / 5.0), abs=0.4)  # the median of 30 is ~noise-free
    # a prediction that is each real frame itself except for its robot pixels, painted black
    pred = [np.where((s == 255).all(-1, keepdims=True), 0, r).astype(np.uint8) for r, s in zip(real, segs)]
    out = bench.budget(real, pred, segs)
    regions = out["regions"]
    assert sum(r["error_share"] for r in regions.values()) == pytest.approx(1.0, abs=2e-3)
    assert regions["robot"]["error_share"] == pytest.approx(1.0) and regions["backdrop"]["psnr"] == float("inf")
    assert sum(r["pixel_share"] for r in regions.values()) == pytest.approx(1.0, abs=2e-3)
