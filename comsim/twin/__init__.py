"""The digital twin: calibrate the camera, localize objects, match colours, replay real episodes.

    from comsim.twin.calibrate import calibrate_folder, calibrate_camera, solve_pnp, intrinsics_from_checkerboard
    calibrate_folder(folder, robot="panda", out=DIR)     # comsim twin calibrate: DIR/calibration.json + overlays
    from comsim.twin.replay import replay_dataset
    replay_dataset(real, twin_yaml, out, mode="physics")  # comsim twin replay: paired LeRobotDataset + report
    from comsim.twin.alignment_report import alignment_report  # OUT/alignment_report.json

Modules: silhouette (robot-only renderer), pose_fit (coarse search + contour Gauss-Newton),
calibrate (robust calibration, unsynchronized frames, PnP, checkerboard), frames (folder
loading and checks), masks (robot masks without a board or masks), align (dataset-level
alignment rounds), localize (objects on the table), colors (material matching),
camera_model (the real camera's distortion for the twin's view), camera_motion (the camera's motion
after calibration, from the frames), uncertainty (each object's position uncertainty), replay, overlay
(silhouette outlines on frames), alignment_report (scores a replay against masks derived from the real frames).
"""
import comsim.sim  # noqa: F401  (picks the headless GL backend before mujoco is imported)
