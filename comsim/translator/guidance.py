"""Compositional guidance: one batched forward, three conditions.

    v = v_none + w_action * (v_action - v_none) + w_sim * (v_sim - v_none)

Written as a weighted sum  v = (1 - w_action - w_sim) v_none + w_action v_action + w_sim v_sim,
only the branches with a non-zero coefficient are evaluated, stacked on the batch axis
(up to 3B) and run through the model once. ``w_action=1, w_sim=0`` is the action-only
model, ``w_action=0, w_sim=1`` the sim-only model, ``0, 0`` the unconditional one.
"""
from __future__ import annotations

import torch

from comsim.translator.model import velocity_from_output

# (action_keep, sim_keep) of each branch
BRANCHES = {"none": (False, False), "action": (True, False), "sim": (False, True)}


def compose(v_none, v_action, v_sim, w_action: float, w_sim: float):
    return v_none + w_action * (v_action - v_none) + w_sim * (v_sim - v_none)


def branch_coefficients(w_action: float, w_sim: float) -> dict[str, float]:
    coefs = {"none": 1.0 - w_action - w_sim, "action": float(w_action), "sim": float(w_sim)}
    return {k: c for k, c in coefs.items() if c != 0.0} or {"none": 0.0}


def guided_velocity(model, latents, timestep, actions, sim_latents, w_action: float, w_sim: float,
                    camera_shift=None):
    """Composed velocity for ``latents`` (B, C, T, H, W) at ``timestep`` (B,) = sigma * 1000, one model call;
    ``camera_shift`` (B, T, 2) px or None, for a model whose plate follows the camera."""
    B = latents.shape[0]
    coefs = branch_coefficients(w_action, w_sim)
    names = list(coefs)
    n = len(names)
    dev = latents.device
    action_keep = torch.tensor([BRANCHES[k][0] for k in names], device=dev).repeat_interleave(B)
    sim_keep = torch.tensor([BRANCHES[k][1] for k in names], device=dev).repeat_interleave(B)
    v = model(latents.repeat(n, 1, 1, 1, 1), timestep.repeat(n), actions.repeat(n, 1, 1),
              sim_latents.repeat(n, 1, 1, 1, 1), action_keep=action_keep, sim_keep=sim_keep,
              **({} if camera_shift is None else {"camera_shift": camera_shift.repeat(n, 1, 1)}))
    v = v.float().view(n, B, *v.shape[1:])
    out = sum(coefs[k] * v[i] for i, k in enumerate(names))
    # The coefficients sum to 1 and the map to a velocity is affine in the output: composing
    # x0 predictions and then converting equals converting each branch, then composing.
    return velocity_from_output(out, latents.float(), timestep.float() / 1000.0,
                                model.config.prediction_type)
