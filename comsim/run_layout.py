"""The run folder of ``comsim demo``: its stage names and where each stage writes, in one place.

``comsim demo`` writes the folder, ``comsim report`` reads it; both ask a RunLayout, so renaming a
stage or moving an output cannot break one without the other::

    lab/                      lab (real stand-in) LeRobot dataset
    paired/                   twin replay: real + twin-render videos per episode, the alignment
                              (twin_alignment.json, alignment_report.json, report/*.png)
    twin/summary.json         twin alignment summary
    translator/               training output: train_summary.json, validation/, final/ (the translator)
    sim/, sim_ood/            factory episodes (sim), in- and out-of-distribution layouts
    pseudo_real/, pseudo_real_ood/   the factory episodes converted: <cam> pseudo-real, <cam>_sim
    heldout_pseudo_real/{sim_only,pseudo,real}/   held-out paired episodes, translated
    metrics.json              {comparison: evaluate_video report} (or one report); the video metrics' done marker
    policy/results.json       policy experiment (or results.json at the top, as eval_policy writes)
    stages.json               {"timings": {stage: s}, "failures": {stage: reason}} (demo)
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
    Stage(POLICY, "policy/results.json", "file"),
)


class RunLayout:
    """Paths of one run folder (``root``, the demo's ``--out``)."""

    STAGES = STAGES

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def output(self, stage: str) -> Path:
        """Where ``stage`` (one of the names above) writes its output."""
        for s in STAGES:
            if s.name == stage:
                return self.root / s.output
        raise KeyError(f"no stage {stage!r}; the stages are {[s.name for s in STAGES]}")

    # stage outputs, and the folders around them
    @property
    def lab(self) -> Path:
        return self.output(LAB_RECORD)

    @property
    def paired(self) -> Path:
        return self.output(TWIN)

    @property
    def twin(self) -> Path:
        return self.root / "twin"

    @property
    def twin_summary(self) -> Path:
        return self.twin / "summary.json"

    @property
    def translator(self) -> Path:
        return self.root / "translator"

    @property
    def translator_final(self) -> Path:
        return self.output(TRANSLATOR).parent

    @property
    def sim(self) -> Path:
        return self.output(FACTORY)

    @property
    def sim_ood(self) -> Path:
        return self.root / "sim_ood"

    @property
    def pseudo_real(self) -> Path:
        return self.output(CONVERT)

    @property
    def pseudo_real_ood(self) -> Path:
        return self.root / "pseudo_real_ood"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout_pseudo_real"

    def heldout_part(self, part: str) -> Path:
        """``pseudo`` (translated), ``sim_only`` (the twin render) or ``real`` (the lab frames)."""
        if part not in ("pseudo", "sim_only", "real"):
            raise KeyError(f"no held-out part {part!r}; the parts are pseudo, sim_only, real")
        return self.heldout / part

    @property
    def metrics(self) -> Path:
        return self.output(VIDEO_METRICS)

    @property
    def policy(self) -> Path:
        return self.output(POLICY).parent

    @property
    def policy_results(self) -> Path:
        return self.output(POLICY)

    @property
    def stages(self) -> Path:
        return self.root / "stages.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def report_media(self) -> Path:
        return self.root / "report_media"
