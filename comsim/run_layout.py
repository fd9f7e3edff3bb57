"""The run folder of ``comsim run`` / ``comsim demo``: its stage names and where each stage writes, in one place.

``comsim run`` and ``comsim demo`` write the folder, ``comsim report`` reads it; both ask a RunLayout, so renaming a
stage or moving an output cannot break one without the other::

    lab/                      lab (real stand-in) LeRobot dataset (``comsim demo``; ``comsim run`` reads the user's)
    paired/                   twin replay: real + twin-render videos per episode, the alignment
                              (twin_alignment.json, alignment_report.json, report/*.png)
    twin/summary.json         twin alignment summary
    translator/               training output: train_summary.json, validation/, final/ (the translator)
    sim/, sim_ood/            factory episodes (sim), in- and out-of-distribution layouts
    pseudo_real/, pseudo_real_ood/   the factory episodes converted: <cam> pseudo-real, <cam>_sim
    mixed/                    the real episodes + pseudo-real ones at a synthetic fraction (mixture.json), <cam> only
    heldout_pseudo_real/{sim_only,pseudo,real,global_color,compositor}/   held-out paired episodes: the
                              twin render, translated, the lab frames, the no-network baselines' guesses
    baselines/<kind>/         the no-network baselines fit on the training pairs (Baseline.save)
    metrics.json              {comparison: evaluate_video report} (or one report); the video metrics' done marker
    policy/                   the policy experiment's folder (ExperimentLayout): results.json, results.md,
                              arms/<arm>-<key>/ (policy/, eval-<panel>-<key>.json, trials-<panel>-<key>.jsonl,
                              videos/), cache/ (decoded frames shared by the arms)
    stages.json               {"timings": {stage: s}, "failures": {stage: reason}, "left_out": {stage: why}}
    report.html, report_media/   the report
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# stage names, as the demo logs them and stages.json records them
LAB_RECORD = "lab record"
TWIN = "twin calibrate + replay"
TRANSLATOR = "translator training"
FACTORY = "factory generate"
CONVERT = "convert"
VIDEO_METRICS = "video metrics"
HELDOUT_PARTS = ("pseudo", "sim_only", "real", "global_color", "compositor")
MIX = "mix"
POLICY = "policy experiment"


@dataclass(frozen=True)
class Stage:
    name: str
    output: str  # under the run folder: a dataset folder, or the file whose presence says "done"
    kind: str  # "dataset" or "file"


STAGES = (
    Stage(LAB_RECORD, "lab", "dataset"),
    Stage(TWIN, "paired", "dataset"),
    Stage(TRANSLATOR, "translator/final/translator.json", "file"),
    Stage(FACTORY, "sim", "dataset"),
    Stage(CONVERT, "pseudo_real", "dataset"),
    Stage(VIDEO_METRICS, "metrics.json", "file"),
    Stage(MIX, "mixed", "dataset"),
    Stage(POLICY, "policy/results.json", "file"),  # ExperimentLayout("policy").results
)


class ExperimentLayout:
    """Paths of one policy experiment's folder (``output_dir``; the demo's ``policy/``)."""

    def __init__(self, root: str | Path):
        self.root = r = Path(root)
        self.results, self.results_md = r / "results.json", r / "results.md"
        self.arms, self.cache = r / "arms", r / "cache"

    def arm(self, name: str, key: str) -> Path:
        """An arm's folder: its name and the hash of its data, policy and training config."""
        return self.arms / f"{name}-{key}"

    @staticmethod
    def eval_file(arm_dir: Path, panel: str, key: str) -> Path:
        return Path(arm_dir) / f"eval-{panel}-{key}.json"

    @staticmethod
    def eval_files(arm_dir: Path, panel: str) -> list[Path]:
        return sorted(Path(arm_dir).glob(f"eval-{panel}-*.json"))

    @staticmethod
    def trial_log(arm_dir: Path, panel: str, key: str) -> Path:
        return Path(arm_dir) / f"trials-{panel}-{key}.jsonl"


class RunLayout:
    """Paths of one run folder (``root``, the demo's ``--out``)."""

    STAGES = STAGES

    def __init__(self, root: str | Path):
        self.root = r = Path(root)
        # the stage outputs
        self.lab, self.paired, self.sim, self.pseudo_real = (self.output(s) for s in (LAB_RECORD, TWIN, FACTORY, CONVERT))
        self.mixed = self.output(MIX)
        self.metrics, self.policy_results = self.output(VIDEO_METRICS), self.output(POLICY)
        # and the folders and files around them
        self.twin = r / "twin"
        self.twin_summary = self.twin / "summary.json"
        self.translator = r / "translator"
        self.translator_final = self.output(TRANSLATOR).parent
        self.sim_ood, self.pseudo_real_ood = r / "sim_ood", r / "pseudo_real_ood"
        self.heldout = r / "heldout_pseudo_real"
        self.baselines = r / "baselines"  # the no-network baselines fit on the training pairs (<kind>/)
        self.policy = self.policy_results.parent
        self.experiment = ExperimentLayout(self.policy)
        self.stages = r / "stages.json"
        self.report, self.report_media = r / "report.html", r / "report_media"

    def output(self, stage: str) -> Path:
        """Where ``stage`` (one of the names above) writes its output."""
        for s in STAGES:
            if s.name == stage:
                return self.root / s.output
        raise KeyError(f"no stage {stage!r}; the stages are {[s.name for s in STAGES]}")

    def heldout_part(self, part: str) -> Path:
        """``pseudo`` (translated), ``sim_only`` (the twin render), ``real`` (the lab frames), or a no-network
        baseline's guess (``global_color``, ``compositor``: comsim.translator.compositor)."""
        if part not in HELDOUT_PARTS:
            raise KeyError(f"no held-out part {part!r}; the parts are {', '.join(HELDOUT_PARTS)}")
        return self.heldout / part
