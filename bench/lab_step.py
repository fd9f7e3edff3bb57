"""Benchmark: where one closed-loop frame of a policy trial in the lab spends its time.

    MUJOCO_GL=egl python bench/lab_step.py --experiment configs/experiments/lab_table.yaml --frames 300

Runs the lab push task as ``comsim.lab.rollout`` does (reset, then one action, one
physics hold and one observation per frame) with the experiment's policy freshly
initialised (its weights do not change the cost), and times each part of a frame:
the policy's ``select_action``, the physics (``Scene.step`` for one frame), the shadowed
render, the sensor model (lens, noise, JPEG) and the success check. Episodes restart every
``--episode`` frames. Prints one JSON object as its last line: median milliseconds per part,
the frames/s of the whole loop, torch threads and llvmpipe threads (null: its default, one per core).

``--against KEY=VALUE ...`` also renders every frame in a second lab built with those dotted overrides of
the lab cell (e.g. ``scene.robot.light_tolerance=0.002``: robot meshes drawn at 2 mm;
``look.lights.1.castshadow=true``: a second shadow-casting light), with the same physics state copied
in, and adds how far the two clean renders are apart: the mean |difference| in grey levels and the
fraction of pixel values that differ by more than 16, with that render's median milliseconds.
"""
import argparse
import json
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="configs/experiments/lab_table.yaml")
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--episode", type=int, default=100, help="frames per episode before a reset")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the experiment's lanes use 1)")
    p.add_argument("--against", nargs="+", default=None, metavar="KEY=VALUE",
                   help="compare each render with one of the lab cell under these dotted overrides")
    args = p.parse_args(argv)

    import mujoco
    import numpy as np
    import torch

    from comsim.lab import LabEnv
    from comsim.lab.cell import load_lab_cell
    from comsim.pipeline.experiment import load_experiment
    from comsim.policy.config import policy_config
    from comsim.policy.policies import make_policy

    torch.set_num_threads(args.threads)
    cfg = load_experiment(args.experiment)
    policy = make_policy(policy_config(cfg.policy)).eval()
    parts = {k: [] for k in ("policy", "physics", "render", "sensor", "success")}
    rng = np.random.default_rng(0)
    other, diffs, render_other = None, [], []
    if args.against is not None:
        other = LabEnv(load_lab_cell(cfg.cell, args.against), cfg.task)
    with LabEnv(cfg.cell, cfg.task) as env:
        n, t_all = 0, 0.0
        while n < args.frames:
            obs = env.reset(1000 + n)
            policy.reset()
            gen = torch.Generator().manual_seed(n)
            for _ in range(min(args.episode, env.max_frames, args.frames - n)):
                t0 = time.perf_counter()
                action = policy.select_action(obs, gen)
                action[7] = np.clip(action[7], 0.0, 1.0)
                t1 = time.perf_counter()
                env.scene.step(np.asarray(action, np.float64),
                               n_substeps=env.control_steps_per_frame * env.scene.spec.physics.substeps)
                env.frame += 1
                t2 = time.perf_counter()
                clean = env.camera.clean()
                t3 = time.perf_counter()
                image = env.camera.sensor(clean, rng)
                t4 = time.perf_counter()
                env.success()
                t5 = time.perf_counter()
                obs = {"image": image, "state": env.scene.get_state().astype(np.float32)}
                if other is not None:
                    src, dst = env.scene.data, other.scene.data  # same bodies and joints, other meshes
                    dst.qpos[:], dst.qvel[:], dst.mocap_pos[:], dst.mocap_quat[:] = (
                        src.qpos, src.qvel, src.mocap_pos, src.mocap_quat)
                    mujoco.mj_forward(other.scene.model, dst)
                    t6 = time.perf_counter()
                    clean_other = other.camera.clean()
                    render_other.append(time.perf_counter() - t6)
                    diffs.append(np.abs(clean.astype(np.int16) - clean_other.astype(np.int16)))
                for k, a, b in (("policy", t0, t1), ("physics", t1, t2), ("render", t2, t3), ("sensor", t3, t4),
                                ("success", t4, t5)):
                    parts[k].append(b - a)
                t_all += t5 - t0
                n += 1
    out = {f"{k}_ms": round(1000 * float(np.median(v)), 2) for k, v in parts.items()}
    if other is not None:
        other.close()
        d = np.stack(diffs)
        out.update(against=args.against, look_mean_abs_diff=round(float(d.mean()), 2),
                   look_frac_over_16=round(float((d > 16).mean()), 4),
                   render_against_ms=round(1000 * float(np.median(render_other)), 2))
    out.update(frames=n, loop_fps=round(n / t_all, 1), torch_threads=args.threads,
               llvmpipe_threads=os.environ.get("LP_NUM_THREADS"), cpu_count=os.cpu_count())
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
