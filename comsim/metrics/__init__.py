"""Video metrics: paired frame metrics (PSNR, SSIM, LPIPS), Frechet distances (FID, FVD),
CLIP scores where weights are on disk, and action consistency against the twin.

    from comsim.metrics import evaluate_video
    report = evaluate_video("runs/pseudo_real", "runs/lab", camera="front", i3d="i3d_torchscript.pt")

Heavy pieces (networks, MuJoCo) load only when a metric needs them.
"""
from comsim.metrics.action import RobotColourModel, action_consistency, mask_iou, render_robot_masks
from comsim.metrics.evaluate import METRICS, EvalOptions, evaluate_video, open_video_source, to_json_safe
from comsim.metrics.frame import load_lpips, lpips_distance, psnr, ssim
from comsim.metrics.frechet import (I3DFeatures, InceptionFeatures, MetricUnavailable, fid, frechet_distance,
                                    frechet_distance_from_features, fvd, gaussian_stats, video_clips)

__all__ = [
    "METRICS", "EvalOptions", "I3DFeatures", "InceptionFeatures", "MetricUnavailable", "RobotColourModel",
    "action_consistency", "evaluate_video", "fid", "frechet_distance", "frechet_distance_from_features", "fvd",
    "gaussian_stats", "load_lpips", "lpips_distance", "mask_iou", "open_video_source", "psnr",
    "render_robot_masks", "ssim", "to_json_safe", "video_clips",
]
