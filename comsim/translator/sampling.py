"""SamplingParams: how a translator samples, the one form these settings travel in.

    params = SamplingParams(num_steps=4, w_action=1.0)      # None: the translator's own setting
    frames = pipe.translate_episode(episode, params, seed=0)
    convert_dataset(model, sim, out, sampling=params)

A translator's own settings come from its training config's ``sampling:`` section, saved in
translator.json; ``resolved(own)`` fills what a call leaves as None. The same fields are
recorded in a conversion's header and in every pseudo-real episode's provenance.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from comsim.config import ConfigError


# the `comsim convert` flag of each field, named in errors beside the config key
FLAGS = {"num_steps": "--steps", "w_action": "--w-action", "w_sim": "--w-sim", "overlap": "--overlap",
         "strength": "--strength"}


@dataclass
class SamplingParams:
    num_steps: int | None = None  # Euler steps of the flow ODE (at strength 1)
    w_action: float | None = None  # composed guidance: v_none + w_action (v_action - v_none) + w_sim (v_sim - v_none)
    w_sim: float | None = None
    overlap: int | None = None  # frames shared by consecutive windows of an episode (None: half a window)
    strength: float = 1.0  # < 1: start from the sim video noised to that level (SDEdit), fewer steps

    def __post_init__(self):
        for name in ("w_action", "w_sim", "strength"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                # NaN guidance would write NaN frames as pseudo-real
                raise ConfigError(f"sampling.{name} ({FLAGS[name]}): expected a finite number, got {v!r}")
            if v is not None:
                setattr(self, name, float(v))
        if self.num_steps is not None and (isinstance(self.num_steps, bool) or int(self.num_steps) != self.num_steps
                                           or self.num_steps < 1):
            raise ConfigError(f"sampling.num_steps ({FLAGS['num_steps']}): expected an integer >= 1, "
                              f"got {self.num_steps!r}")
        if not 0.0 < self.strength <= 1.0:
            raise ConfigError(f"sampling.strength ({FLAGS['strength']}): expected a number in (0, 1], "
                              f"got {self.strength!r}")
        if self.overlap is not None and (isinstance(self.overlap, bool) or int(self.overlap) != self.overlap
                                         or self.overlap < 1):
            raise ConfigError(f"sampling.overlap ({FLAGS['overlap']}): expected an integer >= 1 or null, "
                              f"got {self.overlap!r}")
        self.num_steps = None if self.num_steps is None else int(self.num_steps)
        self.overlap = None if self.overlap is None else int(self.overlap)

    def resolved(self, own: "SamplingParams") -> "SamplingParams":
        """These settings, with ``own``'s where they are None."""
        mine = dataclasses.asdict(self)
        return SamplingParams(**{k: (getattr(own, k) if v is None else v) for k, v in mine.items()})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# a translator's own settings when its translator.json records none
DEFAULT_SAMPLING = SamplingParams(num_steps=20, w_action=1.0, w_sim=1.0, overlap=None)
