"""Sampling goes through the scheduler's own ``step``; the frames it makes are pinned.

tests/data/sampling_reference.npz holds the frames that the hand-written Euler loop made
(before sampling went through ``scheduler.step``) for a seeded, untrained micro model:
the refactor must reproduce them. Re-record only for an intended change of the samples:
``python tests/test_sampling.py --record``.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from comsim.translator.codec import PixelCodec
from comsim.translator.data import ActionNormalizer
from comsim.translator.model import CompositionalVideoDiT
from comsim.translator.pipeline import TranslatorPipeline
from comsim.translator.sampling import SamplingParams
from comsim.translator.synthetic import make_synthetic_pairs

REFERENCE = Path(__file__).parent / "data" / "sampling_reference.npz"
# (scheduler shift, call arguments): all three guidance branches, a shifted schedule with
# overlapping windows (7 frames, window 4), and SDEdit-style strength < 1
CASES = {
    "composed": (1.0, SamplingParams(num_steps=5, w_action=1.2, w_sim=1.5), 4),
    "shifted_windows": (3.0, SamplingParams(num_steps=6, w_action=0.0, w_sim=1.0, overlap=2), 1),
    "strength": (1.0, SamplingParams(num_steps=8, strength=0.5), 2),
}


def micro_pipeline(shift: float) -> TranslatorPipeline:
    torch.manual_seed(0)
    model = CompositionalVideoDiT(in_channels=3, sim_channels=3, action_dim=8, num_frames=4, sample_size=(16, 16),
                                  patch_size=(1, 4, 4), dim=32, depth=2, heads=2)
    with torch.no_grad():  # AdaLN-Zero starts at zero output: randomize so that the conditions show
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return TranslatorPipeline(model.eval(), PixelCodec(), FlowMatchEulerDiscreteScheduler(shift=shift),
                              ActionNormalizer(np.zeros(8), np.ones(8)), num_frames=4, resolution=(16, 16))


def sample(name: str) -> np.ndarray:
    shift, sampling, seed = CASES[name]
    ep = make_synthetic_pairs(1, 7, 16, seed=3)[0]
    return micro_pipeline(shift)(ep.frames["front_sim"], ep.action, sampling, seed=seed)


@pytest.mark.parametrize("name", list(CASES))
def test_samples_match_the_recorded_ones(name):
    want = np.load(REFERENCE)[name]
    got = sample(name)
    assert got.shape == want.shape == (7, 16, 16, 3) and got.dtype == np.uint8
    # bit-identical on the machine that recorded them; another CPU's float kernels may round a
    # value to the neighbouring level, never further (a changed step moves whole frames)
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())


def test_the_loop_calls_the_schedulers_step():
    """Swapping the scheduler changes the samples: the loop asks it for each step."""
    pipe = micro_pipeline(1.0)
    calls = []
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda *a, **k: calls.append(a[1]) or step(*a, **k)
    ep = make_synthetic_pairs(1, 4, 16, seed=3)[0]
    pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=5), seed=0)
    assert len(calls) == 5 and torch.allclose(torch.stack(calls), pipe.scheduler.timesteps)
    # strength 0.5 runs the last half of the schedule, starting where the scheduler's begin index says
    calls.clear()
    pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=6, strength=0.5), seed=0)
    assert len(calls) == 3 and torch.allclose(torch.stack(calls), pipe.scheduler.timesteps[3:])
    # a stochastic flow-matching scheduler (its own step re-noises) gives other frames than the ODE one
    ode = pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=5), seed=0)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, stochastic_sampling=True)
    sde = pipe(ep.frames["front_sim"], ep.action, SamplingParams(num_steps=5), seed=0)
    assert np.abs(ode.astype(int) - sde).mean() > 1.0


if __name__ == "__main__" and "--record" in sys.argv:
    torch.set_num_threads(1)
    REFERENCE.parent.mkdir(exist_ok=True)
    np.savez_compressed(REFERENCE, **{name: sample(name) for name in CASES})
    print("recorded", REFERENCE)
