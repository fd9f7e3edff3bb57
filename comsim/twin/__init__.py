"""The digital twin: calibrate the camera, localize objects, match colours, replay real episodes.

    calibrate_folder(folder, robot="panda", out=DIR)   # comsim twin calibrate
    replay_dataset(real, twin, out, mode="physics")    # comsim twin replay
"""
import comsim.sim  # noqa: F401  (picks the headless GL backend before mujoco is imported)
