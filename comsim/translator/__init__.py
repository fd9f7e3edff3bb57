"""The translator (neural simulator): sim video + actions -> pseudo-real video.

    from comsim.translator import TranslatorPipeline
    pipe = TranslatorPipeline.from_pretrained("runs/translator-tiny/final")
    frames = pipe(sim_frames, actions, SamplingParams(num_steps=20, w_action=1.0, w_sim=1.0), seed=0)

model.py      CompositionalVideoDiT (diffusers ModelMixin/ConfigMixin)
codec.py      PixelCodec, DiffusersVAECodec (image VAE per frame, video VAE per clip)
guidance.py   compose / guided_velocity: v_none + w_a (v_a - v_none) + w_s (v_s - v_none), one forward
pipeline.py   TranslatorPipeline: save/load, Euler sampling, strength, overlapping windows
data.py       PairedWindowDataset (LeRobot paired datasets or Episodes), ActionNormalizer, latent cache
training.py   configs, the accelerate training loop, checkpoints, validation
synthetic.py  synthetic paired episodes and the action-consistency measure

Names are imported lazily: ``import comsim.translator`` does not import torch or diffusers.
"""
import importlib

_EXPORTS = {
    "CompositionalVideoDiT": "model", "PixelCodec": "codec", "DiffusersVAECodec": "codec", "build_codec": "codec",
    "compose": "guidance", "guided_velocity": "guidance", "TranslatorPipeline": "pipeline",
    "TranslatorMismatchError": "pipeline", "PairedWindowDataset": "data", "ActionNormalizer": "data",
    "TranslatorConfig": "training", "load_train_config": "training", "train": "training",
    "make_synthetic_pairs": "synthetic", "arm_placement": "synthetic",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
