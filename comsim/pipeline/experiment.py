"""The Compositional Simulation experiment: same policy, different training data, scored in the lab.

    cfg = load_experiment("configs/experiments/compsim_table.yaml", ["eval.n_trials=20"])
    results = run_experiment(cfg)       # -> output_dir/results.json and results.md

An experiment names its datasets (``datasets``: path, and how to build it when missing),
its arms (``arms``: mixtures of those datasets with a synthetic fraction) and optionally a
synthetic-fraction sweep (``sweep``: one mixture, several fractions; each fraction is one
more arm). Each arm trains one policy (``comsim.policy.training``) and is scored on every
panel of ``eval`` (``comsim.lab.rollout``; in-distribution and out-of-distribution
object positions); ``claim`` says which arm should beat which, by a margin outside the 95%
intervals (lower bound above the other's upper bound), and the result says whether it did.

Resumable: arm ``a`` lives in ``output_dir/arms/<a>-<hash of its data, policy and training
config>``; a finished policy is not retrained, a finished panel not re-scored (its file is
keyed by the eval config), so rerunning the command only does what is missing. Missing
datasets are built by the run's stage functions as their spec says (``comsim.pipeline.stages``:
``build: lab`` records demonstrations, ``factory`` generates sim episodes, ``convert`` translates
them into pseudo-real ones); an arm whose data cannot be made (no translator yet, no ``build``)
is skipped, with the reason in the table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from comsim.config import PRECISIONS, ConfigError, load_config, to_dict
from comsim.episode import hash_dict
from comsim.errors import ComSimError
from comsim.io.files import atomic_output
from comsim.io.lerobot import DatasetError, dataset_complete, dataset_fingerprint
from comsim.lab.cell import Region
from comsim.lab.record import STILLS
from comsim.lab.rollout import PanelConfig
from comsim.pipeline import stages
from comsim.policy.config import MixtureConfig, PolicyRunConfig, SourceConfig, TrainConfig, policy_config
from comsim.run_layout import ExperimentLayout
from comsim.translator.sampling import SamplingParams

BUILDS = ("lab", "factory", "demo_derived", "convert", "compose")
# the version of this module's training and scoring: part of every arm's and panel's identity, so a change
# here that changes results is never mixed with results made before it
EXPERIMENT_VERSION = 2
INPUTS_FILE = "inputs.json"
COMMIT_FILE = "commit.json"  # in an arm's folder: the commit of the code that trained it (code_commit)
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass
class DatasetSpec:
    """A dataset of the experiment, and how to make it when ``path`` holds none (``build``):
    lab: record scripted demonstrations in the lab (stages.record_lab);
    factory: generate sim episodes (stages.generate_sim; render under <cam>_sim);
    demo_derived: sim episodes from the real demos of the paired dataset ``paired`` (stages.generate_demo_derived);
    convert: translate the sim dataset ``input`` with the translator ``translator`` (stages.convert_sim);
    compose: the sim dataset ``input`` through the no-network compositor fit on ``paired`` (stages.compose_sim)."""
    path: str
    build: str | None = None  # lab | factory | convert | null (must exist)
    episodes: int = 10  # lab / factory: how many
    seed: int = 0
    program: str | None = None  # factory: task YAML or built-in name; default: the experiment's task
    split: str = "id"  # factory: layout split
    controls: list[str] = field(default_factory=list)  # factory: control videos beside the render (e.g. [seg],
    #                                                    which a translator conditioned on segmentation needs)
    paired: str | None = None  # demo_derived: the real demos' twin replay (a paired dataset); compose: the pairs
    #                            the compositor is fit on
    scene: str | None = None  # factory: twin scene YAML to generate in, e.g. the aligned twin
    #                           PAIRED/twin_aligned.yaml (default: the task's own, the nominal cell)
    input: str | None = None  # convert, compose: name of the sim dataset (an entry of `datasets`)
    translator: str | None = None  # convert: the translator's folder
    sampling: SamplingParams = field(default_factory=SamplingParams)  # convert: None fields: the translator's own
    precision: str = "fp32"  # convert: fp32 | bf16 (the translator under autocast)
    workers: int = 1  # factory / convert: processes
    # lab: start regions that replace the task's own (object name -> x, y, yaw ranges), e.g.
    # a wider cube region so that the demonstrations also cover the OOD panel's layouts
    regions: dict[str, Region] | None = None

    def __post_init__(self):
        if self.build is not None and self.build not in BUILDS:
            raise ConfigError(f"build: expected one of {BUILDS} or null, got {self.build!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: expected fp32 or bf16, got {self.precision!r}")
        if self.build == "demo_derived" and not self.paired:
            raise ConfigError("build: demo_derived needs `paired` (the real demos' twin replay)")
        if self.build == "convert" and not (self.input and self.translator):
            raise ConfigError("build: convert needs `input` (the sim dataset's name) and `translator` (a folder)")
        if self.build == "compose" and not (self.input and self.paired):
            raise ConfigError("build: compose needs `input` (the sim dataset's name) and `paired` (the pairs the "
                              "compositor is fit on)")


@dataclass
class EvalConfig:
    n_trials: int = 50  # per panel
    seed: int = 100_000  # trial i starts from lab seed episode_seed(seed, i): never a training episode's seed
    panels: dict[str, PanelConfig] = field(
        default_factory=lambda: {"id": PanelConfig("id"), "ood": PanelConfig("ood")})
    max_seconds: float | None = None  # episode timeout; None: the task's max_seconds
    num_inference_steps: int | None = None  # DDIM steps; None: the policy's
    videos: int = 0  # save the first N trials of each panel as mp4 (the first success and failure are always saved)
    workers: int = 1  # processes scoring panels at once (one panel per process); results do not depend on it

    def __post_init__(self):
        if self.n_trials < 1:
            raise ConfigError(f"eval.n_trials: expected >= 1, got {self.n_trials}")
        if not self.panels:
            raise ConfigError("eval.panels: at least one panel is needed")
        if self.workers < 1:
            raise ConfigError(f"eval.workers: expected >= 1, got {self.workers}")


@dataclass
class ArmConfig:
    name: str
    sources: list[SourceConfig]
    label: str = ""  # shown in the table; default: made from the data
    synthetic_fraction: float | None = None  # None: proportional to frames


@dataclass
class SweepConfig:
    sources: list[SourceConfig]
    fractions: list[float]
    name: str = "sweep"  # arms are called <name>_f<fraction>
    label: str = ""


CLAIM_TESTS = ("mcnemar_exact",)


@dataclass
class ClaimConfig:
    """The claim, written before the run: ``arm`` beats every arm of ``beats`` on every panel of ``panels``.
    Each comparison pools the paired trials of every training seed both arms ran; it holds when the arm's
    success rate is higher by at least ``min_effect`` and the paired test's two-sided p-value is below
    ``alpha``. The block is part of results.json's identity: a table judged by another claim says so."""
    arm: str
    beats: list[str]
    panels: list[str] = field(default_factory=lambda: ["id", "ood"])
    test: str = "mcnemar_exact"  # exact McNemar on the discordant trials (comsim.pipeline.stats)
    alpha: float = 0.05
    min_effect: float = 0.10  # success-rate points (0.10: ten points)
    statement: str = ""  # the claim in words, as the table prints it

    def __post_init__(self):
        if self.test not in CLAIM_TESTS:
            raise ConfigError(f"claim.test: expected one of {CLAIM_TESTS}, got {self.test!r}")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"claim.alpha: expected a number in (0, 1), got {self.alpha}")
        if not 0 <= self.min_effect < 1:
            raise ConfigError(f"claim.min_effect: expected a number in [0, 1), got {self.min_effect}")


@dataclass
class ComparisonConfig:
    """Paired comparisons reported beside the claim, judged by nothing: each pair is (arm, other), on every panel
    of ``panels`` (default: all), with the same paired test as the claim."""
    title: str
    pairs: list[tuple[str, str]]
    panels: list[str] | None = None


@dataclass
class GapConfig:
    """"Gap closed" of every arm: (arm - baseline) / (oracle - baseline), per panel: 0 is no
    better than the few real demonstrations, 1 as good as many real ones."""
    baseline: str  # e.g. 10 real
    oracle: str  # e.g. 200 real


@dataclass
class ExperimentConfig:
    name: str
    output_dir: str
    datasets: dict[str, DatasetSpec]
    arms: list[ArmConfig]
    task: str = "push"
    cell: str | None = None  # lab cell YAML (default: the built-in lab)
    sweep: SweepConfig | None = None
    policy: dict = field(default_factory=dict)  # `type: diffusion` (default; `preset: tiny | small | default`) | `keypoint`
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    claim: ClaimConfig | None = None
    # a second pre-registered comparison judged by the same rule (lab_table: the look test, the same motions
    # shown three ways with no real frame)
    look_test: ClaimConfig | None = None
    gap: GapConfig | None = None
    # arms trained on real demonstrations only, in growing numbers: success against the
    # number of demonstrations (the oracle curve)
    curve: list[str] = field(default_factory=list)
    cache_dir: str | None = None  # decoded frames shared by arms; default <output_dir>/cache
    # processes training and scoring arms at once, each with train.num_threads torch threads and its
    # panels scored one after the other; also the processes recording missing lab datasets. On 2 CPU
    # cores two 1-thread lab_table arms side by side took 1031 s for the pair, against ~15 min an arm
    # one after the other with 2 threads (the keypoint policy's small convolutions use a second thread poorly).
    arm_workers: int = 1
    # training seeds: every arm of `seeded_arms` trains once per seed s (train.seed + s) and is scored on a
    # panel of its own (eval.seed + s), the same panel for every arm of that seed; the other arms run seed 0
    seeds: list[int] = field(default_factory=lambda: [0])
    seeded_arms: list[str] = field(default_factory=list)
    # what the OOD panel is out of distribution for, printed with the table
    ood_note: str = ""
    # comparisons reported beside the claim and the look test (not pre-registered: no verdict)
    comparisons: list[ComparisonConfig] = field(default_factory=list)
    # trial records (comsim.pipeline.records) written here after every finished arm, e.g.
    # docs/results/tables/<cell>; None: none. Not part of any arm's or panel's key.
    records_dir: str | None = None

    def __post_init__(self):
        policy_config(self.policy)  # validate early: errors name policy.<field>
        if self.arm_workers < 1:
            raise ConfigError(f"arm_workers: expected >= 1, got {self.arm_workers}")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds) or 0 not in self.seeds:
            raise ConfigError(f"seeds: expected distinct integers >= 0 that include 0, got {self.seeds}")
        names = [a.name for a in self.all_arms()]
        for a in self.seeded_arms:
            if a not in names:
                raise ConfigError(f"seeded_arms: no arm {a!r}; arms are {names}")
        for n in names:
            if not NAME_RE.match(n):
                raise ConfigError(f"arms: name {n!r} must match {NAME_RE.pattern} (it names a folder)")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"arms: duplicate arm names {dup}")
        for name, d in self.datasets.items():
            if d.build in ("convert", "compose") and d.input not in self.datasets:
                raise ConfigError(f"datasets.{name}.input: no dataset {d.input!r}; datasets are {sorted(self.datasets)}")
        if self.sweep is not None:
            for f in self.sweep.fractions:
                if not 0 <= f <= 1:
                    raise ConfigError(f"sweep.fractions: {f} is not in [0, 1]")
        for where, claim in (("claim", self.claim), ("look_test", self.look_test)):
            if claim is None:
                continue
            for a in [claim.arm, *claim.beats]:
                if a not in names:
                    raise ConfigError(f"{where}: no arm {a!r}; arms are {names}")
            for p in claim.panels:
                if p not in self.eval.panels:
                    raise ConfigError(f"{where}.panels: no panel {p!r}; eval.panels are {sorted(self.eval.panels)}")
        for i, c in enumerate(self.comparisons):
            for p in c.panels or []:
                if p not in self.eval.panels:
                    raise ConfigError(f"comparisons[{i}].panels: no panel {p!r}; eval.panels are {sorted(self.eval.panels)}")
        for where, a in ([("gap.baseline", self.gap.baseline), ("gap.oracle", self.gap.oracle)] if self.gap else []) \
                + [(f"curve[{i}]", a) for i, a in enumerate(self.curve)] \
                + [(f"comparisons[{i}].pairs[{j}]", a) for i, c in enumerate(self.comparisons)
                   for j, pair in enumerate(c.pairs) for a in pair]:
            if a not in names:
                raise ConfigError(f"{where}: no arm {a!r}; arms are {names}")

    def all_arms(self) -> list[ArmConfig]:
        arms = list(self.arms)
        for name, d in self.datasets.items():
            if d.build in ("convert", "compose") and d.input not in self.datasets:
                raise ConfigError(f"datasets.{name}.input: no dataset {d.input!r}; datasets are {sorted(self.datasets)}")
        if self.sweep is not None:
            for f in self.sweep.fractions:
                arms.append(ArmConfig(name=f"{self.sweep.name}_f{f:g}", sources=self.sweep.sources,
                                      label=f"{self.sweep.label or self.sweep.name} @ {f:g}", synthetic_fraction=f))
        return arms

    def sweep_arms(self) -> list[str]:
        return [a.name for a in self.all_arms()[len(self.arms):]]

    def sweep_points(self) -> list[str]:
        """The sweep's arms and the main arms with the sweep's mixture (each is one point of it)."""
        if self.sweep is None:
            return []
        mix = to_dict(MixtureConfig(resolve_sources(self, self.sweep.sources)))
        return [a.name for a in self.arms if to_dict(MixtureConfig(resolve_sources(self, a.sources))) == mix] \
            + self.sweep_arms()


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    return load_config(ExperimentConfig, path, overrides)


# ----------------------------------------------------------------------------- arms -> runs


def resolve_sources(cfg: ExperimentConfig, sources: list[SourceConfig]) -> list[SourceConfig]:
    """Dataset names -> paths (a `dataset` that names no entry of `datasets` is a path)."""
    return [dataclasses.replace(s, dataset=cfg.datasets[s.dataset].path) if s.dataset in cfg.datasets else s
            for s in sources]


def seed_config(cfg: ExperimentConfig, seed: int) -> ExperimentConfig:
    """The experiment at training seed ``seed``: train.seed + seed, and a panel of its own (eval.seed + seed).
    Seed 0 is the config itself, so its arms and panels keep their keys when seeds are added."""
    if seed == 0:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=cfg.train.seed + seed),
                               eval=dataclasses.replace(cfg.eval, seed=cfg.eval.seed + seed))


def arm_seeds(cfg: ExperimentConfig, arm: ArmConfig) -> list[int]:
    return sorted(cfg.seeds) if arm.name in cfg.seeded_arms else [0]


def arm_run(cfg: ExperimentConfig, arm: ArmConfig) -> PolicyRunConfig:
    mix = MixtureConfig(sources=resolve_sources(cfg, arm.sources), synthetic_fraction=arm.synthetic_fraction)
    train = {k: v for k, v in to_dict(cfg.train).items() if k not in ("log_every", "save_every", "num_threads")}
    for name, default in (("compile", False), ("precision", "fp32")):
        if train[name] == default:  # a field at its default stays out of the key: adding one keeps the others' keys
            del train[name]
    key = hash_dict({"data": to_dict(mix), "policy": policy_config(cfg.policy).to_dict(), "train": train})
    layout = ExperimentLayout(cfg.output_dir)
    return PolicyRunConfig(output_dir=str(layout.arm(arm.name, key[:8])), data=mix, policy=dict(cfg.policy),
                           train=cfg.train, cache_dir=cfg.cache_dir or str(layout.cache))


def arm_inputs(cfg: ExperimentConfig, arm: ArmConfig) -> dict:
    """What an arm's result depends on beyond its key (which names datasets by path): the content of every
    dataset it trains on, the experiment code's version and the thread count (a CPU reduction's order). An arm
    folder whose recorded inputs differ is stale: it is trained again, never reused."""
    run = arm_run(cfg, arm)
    return {"code": EXPERIMENT_VERSION, "threads": cfg.train.num_threads,
            "datasets": {s.dataset: dataset_fingerprint(s.dataset) for s in run.data.sources}}


def _cell_hash(cell: str | None) -> str:
    from comsim.lab.cell import load_lab_cell
    return load_lab_cell(cell).hash()


def panel_trials(cfg: ExperimentConfig, panel: str) -> int:
    """How many trials the panel runs: its own ``n_trials``, else ``eval.n_trials``."""
    return cfg.eval.panels[panel].n_trials or cfg.eval.n_trials


def _panel_identity(cfg: ExperimentConfig, panel: str) -> dict:
    e = cfg.eval
    where = {k: v for k, v in to_dict(e.panels[panel]).items() if k != "n_trials"}  # the count is not the panel
    return {"task": cfg.task, "cell": cfg.cell, "cell_content": _cell_hash(cfg.cell), "code": EXPERIMENT_VERSION,
            "panel": where, "seed": e.seed, "max_seconds": e.max_seconds, "steps": e.num_inference_steps}


def eval_key(cfg: ExperimentConfig, panel: str) -> str:
    """Key of a panel's results file: the panel, its trials and the cell's content (not only its path)."""
    return hash_dict({**_panel_identity(cfg, panel), "n_trials": panel_trials(cfg, panel)})[:8]


def trials_key(cfg: ExperimentConfig, panel: str) -> str:
    """Key of a panel's trial log: the eval key without the number of trials (trial i is the same
    trial in a panel of 20 and in one of 50, so a longer panel reuses the shorter one's trials)."""
    return hash_dict(_panel_identity(cfg, panel))[:8]


def ensure_datasets(cfg: ExperimentConfig, names: set[str], log=print) -> dict[str, str | None]:
    """Make the named datasets exist (building what their spec says); returns name -> None
    (ready) or why it is missing."""
    status: dict[str, str | None] = {}

    def ensure(name: str) -> str | None:
        if name in status:
            return status[name]
        spec = cfg.datasets[name]
        path = Path(spec.path)
        why = None
        if dataset_complete(path):
            pass
        elif spec.build == "lab":
            log(f"experiment: recording {spec.episodes} lab demonstrations of {cfg.task!r} into {path}")
            _record_lab((cfg.task, spec.episodes, spec.path, spec.seed, _lab_cell(cfg, spec)))
        elif spec.build == "factory":
            log(f"experiment: generating {spec.episodes} sim episodes of {spec.program or cfg.task!r} into {path}")
            stages.generate_sim(spec.program or cfg.task, spec.episodes, path, scene=spec.scene, seed=spec.seed,
                                split=spec.split, controls=spec.controls, workers=spec.workers)
        elif spec.build == "demo_derived":
            if not dataset_complete(spec.paired):
                why = (f"dataset {name!r} ({path}) not found, and the paired dataset it derives from, {spec.paired}, "
                       f"does not exist (replay the real demos with `comsim twin replay`, or set datasets.{name}.paired)")
            else:
                log(f"experiment: deriving {spec.episodes} episodes of {spec.program or cfg.task!r} from the demos "
                    f"of {spec.paired} into {path}")
                stages.generate_demo_derived(spec.paired, spec.episodes, path, task=spec.program, seed=spec.seed,
                                             split=spec.split, controls=spec.controls, workers=spec.workers)
        elif spec.build in ("convert", "compose"):  # the sim dataset `input` made pseudo-real
            convert = spec.build == "convert"
            if not (Path(spec.translator).is_dir() if convert else dataset_complete(spec.paired)):
                # checked first: no sim episodes are made in vain
                why = (f"dataset {name!r} ({path}) not found, and its translator {spec.translator} does not exist "
                       f"(train one with train/train_translator.py, or set datasets.{name}.translator)" if convert
                       else f"dataset {name!r} ({path}) not found, and the pairs its compositor is fit on, "
                            f"{spec.paired}, do not exist (set datasets.{name}.paired)")
            elif upstream := ensure(spec.input):
                why = f"dataset {name!r} needs {spec.input!r}: {upstream}"
            else:
                src = cfg.datasets[spec.input].path
                log(f"experiment: {'converting' if convert else 'composing'} {src} -> {path} "
                    f"({'pseudo-real' if convert else 'no-network compositor'})")
                if convert:
                    stages.convert_sim(spec.translator, src, path, sampling=spec.sampling, seed=spec.seed,
                                       workers=spec.workers, precision=spec.precision)
                else:
                    stages.compose_sim(spec.paired, src, path)
        else:
            why = f"dataset {name!r} ({path}) not found and it has no `build`; produce it and set datasets.{name}.path"
        status[name] = why
        return why

    # lab recordings are independent and single-threaded: record the missing ones side by side
    labs = [n for n in sorted(names) if cfg.datasets[n].build == "lab" and not dataset_complete(cfg.datasets[n].path)]
    if cfg.arm_workers > 1 and len(labs) > 1:
        jobs = []
        for n in labs:
            spec = cfg.datasets[n]
            log(f"experiment: recording {spec.episodes} lab demonstrations of {cfg.task!r} into {spec.path}")
            jobs.append((cfg.task, spec.episodes, spec.path, spec.seed, _lab_cell(cfg, spec)))
        with _pool(min(cfg.arm_workers, len(jobs))) as pool:
            list(pool.map(_record_lab, jobs))
    for n in sorted(names):
        ensure(n)
    return {n: status[n] for n in sorted(names)}


def _lab_cell(cfg: ExperimentConfig, spec: DatasetSpec):
    """The experiment's lab cell with the dataset's start regions (e.g. wider ones for the oracle's demos)."""
    from comsim.lab.cell import load_lab_cell
    from comsim.lab.rollout import panel_cell
    return panel_cell(load_lab_cell(cfg.cell), cfg.task, spec.regions or {})


def _record_lab(job: tuple) -> None:
    task, episodes, path, seed, cell = job
    stages.record_lab(path, task, episodes, seed=seed, cell=cell, calibration_stills=STILLS)


def _pool(workers: int):
    """Worker processes (spawned: no forked MuJoCo or torch state) that end with this process."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from comsim.workers import exit_with_parent
    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=exit_with_parent,
                               initargs=(os.getpid(),))


# ----------------------------------------------------------------------------- running


def arm_with_data(cfg: ExperimentConfig, name: str, where: str = "--arm") -> ArmConfig:
    """The arm called ``name``, its datasets made (built as their specs say); a ConfigError names
    ``where`` when there is no such arm or its data cannot be made."""
    arms = {a.name: a for a in cfg.all_arms()}
    if name not in arms:
        raise ConfigError(f"{where}: no arm {name!r} in the experiment {cfg.name!r}; arms are {sorted(arms)}")
    arm = arms[name]
    missing = [w for w in ensure_datasets(cfg, {s.dataset for s in arm.sources if s.dataset in cfg.datasets}).values()
               if w]
    if missing:
        raise ConfigError(f"cannot run arm {name!r}: {missing[0]}")
    return arm


def run_arm(cfg: ExperimentConfig, arm: ArmConfig, log=print, progress: bool = True, score_apart: bool = False) -> dict:
    """Train (or find) the arm's policy and score it on every panel. ``score_apart``: score in a fresh
    process even with one eval worker (an arm worker renders nothing in the process that trained)."""
    from comsim.policy.data import MixtureDataset
    from comsim.lab.rollout import trial_seeds
    from comsim.policy.training import train_policy

    run = arm_run(cfg, arm)
    out = Path(run.output_dir)
    inputs = arm_inputs(cfg, arm)
    recorded = _recorded_inputs(out)
    unknown = recorded is None and (out / "train_log.json").is_file()  # trained, but on inputs nobody recorded
    if unknown or recorded not in (None, inputs):  # the data or code under this folder changed: start over
        stale = out.with_name(f"{out.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        log(f"experiment: arm {arm.name!r}: its inputs changed since {out} was made; kept as {stale.name}, "
            "trained again")
        out.rename(stale)
    if not (out / INPUTS_FILE).is_file():
        from comsim.io.files import write_json
        out.mkdir(parents=True, exist_ok=True)
        write_json(inputs, out / INPUTS_FILE)
        write_json(code_commit(Path(__file__).parent), out / COMMIT_FILE)  # the code that trains it, for its records
    data = None
    if not (out / "train_log.json").is_file():
        data = MixtureDataset(run.data, run.model_config(), run.cache_dir, where=f"arms[{arm.name}]")
        _check_disjoint(data.episode_seeds(), trial_seeds(cfg.eval.seed, max(panel_trials(cfg, p)
                                                                             for p in cfg.eval.panels)), arm.name)
        log(f"experiment: training arm {arm.name!r} ({len(data)} frames, synthetic fraction "
            f"{data.synthetic_fraction:.3f}) -> {out}")
    train_log = train_policy(run, data=data, progress=progress)
    paths = _panel_files(cfg, out)
    todo = [p for p, path in paths.items() if not path.is_file()]
    for pname in todo:
        log(f"experiment: scoring arm {arm.name!r} on panel {pname!r} ({panel_trials(cfg, pname)} trials)")
    jobs = [(cfg, str(out), p, str(paths[p]), progress and cfg.eval.workers == 1,
             str(ExperimentLayout.trial_log(out, p, trials_key(cfg, p)))) for p in todo]
    # one process per panel (up to eval.workers): a panel's trials do not depend on the process
    if todo and (score_apart or (cfg.eval.workers > 1 and len(todo) > 1)):
        with _pool(min(cfg.eval.workers, len(todo))) as pool:
            list(pool.map(_score_panel, jobs))
    else:
        for job in jobs:
            _score_panel(job)
    return _arm_result(arm, out, train_log, paths)


def _run_arm_in_worker(cfg: ExperimentConfig, arm: ArmConfig) -> dict:
    if cfg.train.num_threads:
        import torch
        torch.set_num_threads(cfg.train.num_threads)
    # Scored in a fresh process: one arm worker, after compiled training (glibc's thresholds raised),
    # crashed in libc's malloc while rendering a panel in the same process (a segfault, once in 8 arms)
    return run_arm(cfg, arm, log=lambda msg: print(msg, flush=True), progress=False, score_apart=True)


def _panel_files(cfg: ExperimentConfig, out: Path) -> dict[str, Path]:
    return {p: ExperimentLayout.eval_file(out, p, eval_key(cfg, p)) for p in cfg.eval.panels}


def _recorded_inputs(out: Path) -> dict | None:
    path = out / INPUTS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def finished_arm(cfg: ExperimentConfig, arm: ArmConfig) -> dict | None:
    """The result of ``arm`` if it is trained and scored on every panel of this config, with the same inputs,
    read from disk (nothing is trained or scored); None when any part is missing or stale."""
    out = Path(arm_run(cfg, arm).output_dir)
    paths = _panel_files(cfg, out)
    log_file = out / "train_log.json"
    if not log_file.is_file() or not all(p.is_file() for p in paths.values()):
        return None
    try:
        if _recorded_inputs(out) != arm_inputs(cfg, arm):
            return None
    except DatasetError:  # a dataset it trains on is not there (yet)
        return None
    return _arm_result(arm, out, json.loads(log_file.read_text()), paths)


def _arm_result(arm: ArmConfig, out: Path, train_log: dict, paths: dict[str, Path]) -> dict:
    panels = {p: json.loads(path.read_text()) for p, path in paths.items()}
    mix = train_log["mixture"]
    return {"name": arm.name, "status": "done", "label": arm.label or _label(mix["parts"]), "dir": str(out),
            "synthetic_fraction": mix["synthetic_fraction"], "synthetic_fraction_requested": arm.synthetic_fraction,
            "sampled_fraction": mix["sampled_fraction"], "data": mix["parts"],
            "train": {k: train_log.get(k) for k in ("steps", "batch_size", "step_time_s", "wall_s", "cpu_s", "threads",
                                                    "final_loss", "num_parameters")},
            "panels": {p: {k: r[k] for k in ("success_rate", "ci95", "successes", "n_trials", "wall_s")}
                       for p, r in panels.items()},
            # per trial: the trial's lab seed -> success (the same seeds for every arm of a training seed)
            "outcomes": {p: {str(t["seed"]): bool(t["success"]) for t in r.get("trials", [])} for p, r in panels.items()}}


def _score_panel(job: tuple) -> None:
    """Score the arm in ``out`` on one panel and write its results file (also run in a worker process)."""
    from comsim.policy.policies import load_policy
    from comsim.lab.rollout import evaluate
    from comsim.io.files import write_json
    cfg, out, pname, path, progress, trial_log = job
    if cfg.train.num_threads:
        import torch
        torch.set_num_threads(cfg.train.num_threads)
    e = cfg.eval
    res = evaluate(load_policy(Path(out) / "policy"), cfg.task, panel_trials(cfg, pname), panel=e.panels[pname],
                   cell=cfg.cell,
                   seed=e.seed, max_seconds=e.max_seconds, num_inference_steps=e.num_inference_steps,
                   video_dir=Path(out) / "videos", videos=e.videos, progress=progress, trial_log=trial_log)
    res["panel"] = pname
    write_json(res, Path(path))


def _check_disjoint(train_seeds: set[int], eval_seeds: list[int], arm: str) -> None:
    both = train_seeds & set(eval_seeds)
    if both:
        raise ConfigError(f"eval.seed: {len(both)} trial seed(s) of arm {arm!r} are seeds of training episodes "
                          f"({sorted(both)[:3]}...); the panel must be one no demonstration saw: change eval.seed")


def _label(parts: list[dict]) -> str:
    counts: dict[str, int] = {}
    for p in parts:
        key = "/".join(p["provenance"]) + ("" if p["camera"] == "front" else f" ({p['camera']})")
        counts[key] = counts.get(key, 0) + p["episodes"]
    return " + ".join(f"{n} {k}" for k, n in counts.items())


def run_experiment(cfg: ExperimentConfig | str | Path, output_dir: str | Path | None = None,
                   datasets: dict[str, str | Path] | None = None, arms: list[str] | None = None,
                   overrides: list[str] | None = None, log=print, progress: bool = True) -> dict:
    """Train and score every arm (or the named ones) that has its data, once per training seed it runs
    (``seeds``, ``seeded_arms``); write results.json/.md.

    With ``arms``, only those are trained and scored; the table also keeps every other arm that
    is already finished on disk for this config (``finished_arm``), so running arms one at a
    time builds up one table instead of replacing it; seeds added to a finished run reuse the
    arms already trained.
    ``cfg``: an ExperimentConfig or its YAML (with dotted ``overrides``); ``output_dir`` and
    ``datasets`` ({name: path}) replace the config's, e.g. for a demo that made the data itself.
    Returns the results document (``rows``: one flat row per arm, for reports)."""
    if not isinstance(cfg, ExperimentConfig):
        cfg = load_experiment(cfg, overrides)
    if output_dir is not None:
        cfg = dataclasses.replace(cfg, output_dir=str(output_dir))
    for name, path in (datasets or {}).items():
        if name not in cfg.datasets:
            raise ConfigError(f"datasets: the experiment {cfg.name!r} has no dataset {name!r} ({sorted(cfg.datasets)})")
        cfg.datasets[name] = dataclasses.replace(cfg.datasets[name], path=str(path))
    every_arm = all_arms = cfg.all_arms()
    if arms:
        unknown = sorted(set(arms) - {a.name for a in all_arms})
        if unknown:
            raise ConfigError(f"--arms: no arm(s) {unknown}; arms are {[a.name for a in all_arms]}")
        all_arms = [a for a in all_arms if a.name in arms]
    check_experiment(cfg, all_arms)
    if cfg.records_dir:  # a records folder of another table is refused before anything runs
        from comsim.pipeline.records import check_definitions
        check_definitions(cfg.records_dir, table_definitions(cfg))
    from comsim.io.lock import output_lock
    with output_lock(cfg.output_dir, "comsim experiment"):  # one writer per output; everything above wrote nothing
        return _run(cfg, every_arm, all_arms, log, progress)


def check_experiment(cfg: ExperimentConfig, arms: list[ArmConfig]) -> None:
    """What can be checked before anything is recorded, generated or trained: every source of the arms names a
    dataset of the experiment or a finished dataset folder, and the lab cell and the task load."""
    from comsim.lab.cell import load_lab_cell
    from comsim.lab.tasks import TASKS

    for a in arms:
        for i, src in enumerate(a.sources):
            if src.dataset not in cfg.datasets and not dataset_complete(src.dataset):
                raise ConfigError(f"arms[{a.name}].sources[{i}].dataset: expected a name of `datasets` "
                                  f"({sorted(cfg.datasets)}) or a finished dataset folder, got {src.dataset!r}")
    used, todo = set(), [src.dataset for a in arms for src in a.sources if src.dataset in cfg.datasets]
    while todo:  # and what they are built from
        name = todo.pop()
        if name in used:
            continue
        used.add(name)
        todo += [n for n in (cfg.datasets[name].input,) if n in cfg.datasets]
    for name in sorted(used):
        d = cfg.datasets[name]
        if d.build is None and not dataset_complete(d.path):
            raise ConfigError(f"datasets.{name}.path: expected a finished dataset folder (build: null means it must "
                              f"exist), got {d.path!r}")
    load_lab_cell(cfg.cell)
    if cfg.task not in TASKS:
        raise ConfigError(f"task: expected a lab task ({sorted(TASKS)}), got {cfg.task!r}")


def _run(cfg: ExperimentConfig, every_arm: list[ArmConfig], all_arms: list[ArmConfig], log, progress: bool) -> dict:
    if cfg.train.num_threads:
        import torch
        torch.set_num_threads(cfg.train.num_threads)
    needed = {s.dataset for a in all_arms for s in a.sources if s.dataset in cfg.datasets}
    missing = ensure_datasets(cfg, needed, log)
    if all_arms and all(any(missing.get(s.dataset) for s in a.sources) for a in all_arms):  # nothing could run
        raise ConfigError(f"experiment {cfg.name!r}: datasets: expected at least one arm with its data, got none: "
                          + "; ".join(f"{k}: {v}" for k, v in sorted(missing.items()) if v))
    t0 = time.time()
    # every (arm, seed) already finished on disk is in each partial table, also one later in the config's
    # order than the one being trained; runs that finish replace their entry
    by_unit = {(a.name, s): finished_arm(seed_config(cfg, s), a) for a in every_arm for s in arm_seeds(cfg, a)}
    skipped_arms: dict[str, dict] = {}

    def table() -> list[dict]:  # in the config's order, the arms with at least one seed done so far
        out = []
        for a in every_arm:
            if a.name in skipped_arms:
                out.append(skipped_arms[a.name])
            elif any(by_unit.get((a.name, s)) for s in arm_seeds(cfg, a)):
                out.append(combine_seeds(cfg, a, {s: by_unit[(a.name, s)] for s in arm_seeds(cfg, a)
                                                  if by_unit.get((a.name, s))}))
        return out

    def skipped(arm: ArmConfig) -> bool:
        why = [missing[s.dataset] for s in arm.sources if missing.get(s.dataset)]
        if why:
            log(f"experiment: skipping arm {arm.name!r}: {why[0]}")
            skipped_arms[arm.name] = {"name": arm.name, "status": "skipped", "label": arm.label, "reason": why[0],
                                      "synthetic_fraction_requested": arm.synthetic_fraction}
            write_results(cfg, table())
        return bool(why)

    def record(unit: tuple[str, int] | None) -> None:  # the trial records of one (arm, seed), or of all
        if cfg.records_dir:
            try:
                export_records(cfg, cfg.records_dir, units=None if unit is None else {unit}, log=log)
            except ComSimError as e:  # the records are a copy of results on disk: the experiment goes on
                log(f"experiment: trial records not written: {e}")

    # a unit whose trials are committed for these inputs is not trained again (another machine ran it)
    recorded = {(a.name, s) for a in all_arms if not any(missing.get(x.dataset) for x in a.sources)
                for s in arm_seeds(cfg, a) if by_unit[(a.name, s)] is None and recorded_unit(cfg, a, s)}
    for name, s in sorted(recorded):
        log(f"experiment: {name!r} seed {s} is recorded in {cfg.records_dir} for these inputs: not trained again")
    todo = [(a, s) for a in all_arms if not any(missing.get(x.dataset) for x in a.sources)
            for s in arm_seeds(cfg, a) if by_unit[(a.name, s)] is None and (a.name, s) not in recorded]
    if cfg.arm_workers > 1 and len(todo) > 1:
        # arms side by side, each in its own process, its panels one after the other inside it
        units = [(a, s) for a in all_arms if not skipped(a) for s in arm_seeds(cfg, a) if (a.name, s) not in recorded]
        lane = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, workers=1))
        from concurrent.futures import as_completed
        with _pool(min(cfg.arm_workers, len(units))) as pool:
            running = {pool.submit(_run_arm_in_worker, seed_config(lane, s), a): (a.name, s) for a, s in units}
            for done in as_completed(running):
                by_unit[running[done]] = done.result()
                write_results(cfg, table())  # after every run: a partial table is always on disk
                record(running[done])
    else:
        for a in all_arms:
            if skipped(a):
                continue
            for s in arm_seeds(cfg, a):
                if (a.name, s) in recorded:
                    continue
                by_unit[(a.name, s)] = run_arm(seed_config(cfg, s), a, log, progress)
                write_results(cfg, table())  # after every run: a partial table is always on disk
                record((a.name, s))
    out = write_results(cfg, table())
    record(None)  # and every (arm, seed) finished before this run
    log(f"experiment: {cfg.name} done in {time.time() - t0:.0f} s -> {ExperimentLayout(cfg.output_dir).results_md}")
    return out


# ----------------------------------------------------------------------------- results


def combine_seeds(cfg: ExperimentConfig, arm: ArmConfig, by_seed: dict[int, dict]) -> dict:
    """One arm's row: its seed-0 run's facts, success pooled over the seeds' panels (each seed its own
    layouts, so the pooled trials are distinct), per-seed results and their spread."""
    from comsim.lab.rollout import wilson_interval

    first = by_seed[min(by_seed)]
    row = {k: v for k, v in first.items() if k not in ("panels", "outcomes")}
    row["seeds_done"] = sorted(by_seed)
    row["seeds_planned"] = arm_seeds(cfg, arm)
    row["panels"], row["outcomes"], row["seeds"], row["spread"] = {}, {}, {}, {}
    for p in cfg.eval.panels:
        k = sum(r["panels"][p]["successes"] for r in by_seed.values())
        n = sum(r["panels"][p]["n_trials"] for r in by_seed.values())
        lo, hi = wilson_interval(k, n)
        row["panels"][p] = {"success_rate": k / n, "ci95": [lo, hi], "successes": k, "n_trials": n,
                            "wall_s": sum(r["panels"][p].get("wall_s") or 0 for r in by_seed.values())}
        row["outcomes"][p] = {key: ok for r in by_seed.values() for key, ok in r.get("outcomes", {}).get(p, {}).items()}
        rates = [r["panels"][p]["success_rate"] for r in by_seed.values()]
        row["spread"][p] = {"min": min(rates), "max": max(rates),
                            "sd": float(statistics.stdev(rates)) if len(rates) > 1 else 0.0}
    for s, r in sorted(by_seed.items()):
        row["seeds"][str(s)] = {"dir": r["dir"], "panels": r["panels"]}
    return row


def judge_claim(cfg: ExperimentConfig, results: list[dict], claim: ClaimConfig | None = None) -> dict | None:
    """Each pre-registered comparison (``claim.arm`` against every ``claim.beats`` arm, on each claimed panel):
    the paired trials both arms ran (every seed both ran), the effect, its interval and the exact McNemar p;
    the claim holds when every comparison's effect is >= min_effect with p < alpha. ``claim``: another
    block judged by the same rule (default: ``cfg.claim``)."""
    from comsim.pipeline.stats import compare, meets, rule_text

    c = claim or cfg.claim
    if c is None:
        return None
    by = {r["name"]: r for r in results if r["status"] == "done"}
    checks, holds = [], True
    for other in c.beats:
        for p in c.panels:
            a, b = by.get(c.arm), by.get(other)
            if not (a and b):
                checks.append({"arm": c.arm, "other": other, "panel": p, "result": "undecided (arm not run)"})
                holds = None if holds is not False else False
                continue
            shared = sorted(set(a["outcomes"][p]) & set(b["outcomes"][p]))
            res = compare({k: a["outcomes"][p][k] for k in shared}, {k: b["outcomes"][p][k] for k in shared})
            ok = meets(res, c.min_effect, c.alpha)
            checks.append({"arm": c.arm, "other": other, "panel": p, **res,
                           "result": "beats" if ok else "does not beat"})
            if not ok:
                holds = False
    return {"arm": c.arm, "beats": c.beats, "panels": c.panels, "statement": c.statement, "holds": holds,
            "checks": checks, "identity": claim_identity(c),
            "rule": rule_text(c.min_effect, c.alpha)}


def claim_identity(claim: ClaimConfig) -> str:
    """A pre-registered block's identity: results and records judged by another block say so."""
    return hash_dict(to_dict(claim))[:12]


def gap_closed(cfg: ExperimentConfig, results: list[dict]) -> dict[str, dict[str, float | None]]:
    """arm -> panel -> (arm - baseline) / (oracle - baseline); None where an arm is missing or
    the oracle is no better than the baseline (nothing to close)."""
    if cfg.gap is None:
        return {}
    by = {r["name"]: r for r in results if r["status"] == "done"}
    base, oracle = by.get(cfg.gap.baseline), by.get(cfg.gap.oracle)
    out = {}
    for r in results:
        out[r["name"]] = {}
        for p in cfg.eval.panels:
            g = None
            if r["status"] == "done" and base and oracle:
                b, o = base["panels"][p]["success_rate"], oracle["panels"][p]["success_rate"]
                if o > b:
                    g = (r["panels"][p]["success_rate"] - b) / (o - b)
            out[r["name"]][p] = g
    return out


def oracle_curve(cfg: ExperimentConfig, results: list[dict]) -> list[dict]:
    """Success of the ``curve`` arms against their number of real demonstrations."""
    by = {r["name"]: r for r in results if r["status"] == "done"}
    points = []
    for name in cfg.curve:
        if name in by:
            r = by[name]
            points.append({"arm": name, "real_episodes": sum(x["episodes"] for x in r["data"] if x["pool"] == "real"),
                           **{p: {k: r["panels"][p][k] for k in ("success_rate", "ci95")} for p in cfg.eval.panels}})
    return sorted(points, key=lambda q: q["real_episodes"])


def write_results(cfg: ExperimentConfig, results: list[dict]) -> dict:
    layout = ExperimentLayout(cfg.output_dir)
    doc = {"experiment": cfg.name, "task": cfg.task, "config": to_dict(cfg), "seeds": cfg.seeds,
           "ood_note": cfg.ood_note, "arms": results, "sweep": cfg.sweep_arms(), "sweep_points": cfg.sweep_points(),
           "claim": judge_claim(cfg, results),
           "look_test": judge_claim(cfg, results, cfg.look_test) if cfg.look_test else None, "gap_closed": gap_closed(cfg, results),
           "curve": oracle_curve(cfg, results), "rows": _rows(cfg, results)}
    with atomic_output(layout.results) as tmp:
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    with atomic_output(layout.results_md) as tmp:
        tmp.write_text(render_markdown(cfg, doc))
    return doc


def _rows(cfg: ExperimentConfig, results: list[dict]) -> list[dict]:
    rows, gaps = [], gap_closed(cfg, results)
    for r in results:
        row = {"arm": r.get("label") or r["name"], "synthetic fraction (asked / drawn)": _fraction(r)}
        for p in cfg.eval.panels:
            row[f"{p} success [95% CI]"] = _cell(r, p) if r["status"] == "done" else f"skipped: {r['reason']}"
        if cfg.gap is not None:
            for p in cfg.eval.panels:
                row[f"{p} gap closed"] = _gap(gaps[r["name"]][p])
        if len(cfg.seeds) > 1:
            row["seeds"] = ", ".join(map(str, r.get("seeds_done", []))) if r["status"] == "done" else "-"
        rows.append(row)
    return rows


def _trial_counts(cfg: ExperimentConfig) -> str:
    counts = {p: panel_trials(cfg, p) for p in cfg.eval.panels}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} seeded trials per panel"
    return "seeded trials per panel: " + ", ".join(f"{p} {n}" for p, n in counts.items())


def _gap(g: float | None) -> str:
    return "-" if g is None else f"{g:+.2f}"


def _cell(r: dict, panel: str) -> str:
    if r["status"] != "done":
        return "-"
    p = r["panels"][panel]
    lo, hi = p["ci95"]
    return f"{100 * p['success_rate']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({p['successes']}/{p['n_trials']})"


def _fraction(r: dict) -> str:
    asked = r.get("synthetic_fraction_requested")
    asked = "natural" if asked is None else f"{asked:g}"
    if r["status"] != "done":
        return asked
    return f"{asked} / {r['sampled_fraction']:.3f}"


def render_markdown(cfg: ExperimentConfig, doc: dict) -> str:
    panels = list(cfg.eval.panels)
    pol = policy_config(cfg.policy)
    seeds = (f"training seeds {', '.join(map(str, cfg.seeds))} for {', '.join(cfg.seeded_arms)} (each seed scored on "
             f"a panel of its own, eval seed {cfg.eval.seed} + seed; the others seed 0), pooled; "
             if len(cfg.seeds) > 1 and cfg.seeded_arms else "")
    lines = [f"# {cfg.name}", "",
             f"Task `{cfg.task}` in the lab; {pol.describe(cfg.eval.num_inference_steps)}, {cfg.train.steps} training steps of "
             f"batch {cfg.train.batch_size}; {_trial_counts(cfg)}; {seeds}success rate with "
             "95% Wilson interval (successes/trials).", ""]
    if cfg.ood_note:
        lines += [f"OOD: {cfg.ood_note}", ""]
    sweep = set(doc["sweep"])

    gaps = doc.get("gap_closed") or {}

    def table(rows, first):
        head = [first, "Synthetic fraction (asked / drawn)", *[f"{p} success" for p in panels],
                *([f"{p} gap closed" for p in panels] if cfg.gap else [])]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            name = r.get("label") or r["name"]
            cells = [_cell(r, p) for p in panels]
            if r["status"] != "done":
                cells = [f"skipped: {r['reason']}"] + [""] * (len(panels) - 1)
            if cfg.gap:
                cells += [_gap(gaps.get(r["name"], {}).get(p)) for p in panels]
            out.append("| " + " | ".join([name, _fraction(r), *cells]) + " |")
        return out

    main = [r for r in doc["arms"] if r["name"] not in sweep]
    if main:
        lines += table(main, "Training data") + [""]
    multi = [r for r in main if r["status"] == "done" and len(r.get("seeds", {})) > 1]
    if multi:
        lines += ["## Per training seed", "", "| Arm | " + " | ".join(f"{p}: per seed (spread sd)" for p in panels) + " |",
                  "|---|" + "---|" * len(panels)]
        for r in multi:
            cells = [", ".join(f"s{s} {100 * v['panels'][p]['success_rate']:.0f}%" for s, v in r["seeds"].items())
                     + f" (sd {100 * r['spread'][p]['sd']:.0f})" for p in panels]
            lines.append(f"| {r.get('label') or r['name']} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(r["name"] in sweep for r in doc["arms"]):
        points = set(doc["sweep_points"])
        sw = sorted([r for r in doc["arms"] if r["name"] in points],
                    key=lambda r: (r.get("synthetic_fraction_requested") is None, r.get("synthetic_fraction_requested")))
        lines += [f"## Synthetic-fraction sweep: {cfg.sweep.label or cfg.sweep.name}", ""]
        lines += table(sw, "Arm") + [""]
    if cfg.gap:
        lines += [f"Gap closed = (arm - `{cfg.gap.baseline}`) / (`{cfg.gap.oracle}` - `{cfg.gap.baseline}`) per panel, "
                  "from the success rates; '-' where the oracle is no better than the baseline.", ""]
    if doc.get("curve"):
        lines += ["## Oracle curve: success against the number of real demonstrations", "",
                  "| Real demonstrations | " + " | ".join(f"{p} success [95% CI]" for p in panels) + " |",
                  "|---|" + "---|" * len(panels)]
        for q in doc["curve"]:
            lines.append(f"| {q['real_episodes']} | " + " | ".join(
                f"{100 * q[p]['success_rate']:.0f}% [{100 * q[p]['ci95'][0]:.0f}, {100 * q[p]['ci95'][1]:.0f}]"
                for p in panels) + " |")
        lines.append("")
    for title, claim in (("Claim", doc.get("claim")), ("Look test", doc.get("look_test"))):
        if not claim:
            continue
        verdict = {True: "HOLDS", False: "DOES NOT HOLD", None: "UNDECIDED"}[claim["holds"]]
        lines += [f"## {title} (fixed before the run)", "",
                  *([claim["statement"], ""] if claim.get("statement") else []),
                  f"`{claim['arm']}` beats {', '.join(f'`{b}`' for b in claim['beats'])} on "
                  f"{', '.join(claim['panels'])} ({claim['rule']}): **{verdict}**", "",
                  "| Comparison | Panel | Paired trials | Arm only / other only | Effect [95% CI] | p (exact McNemar) | Result |",
                  "|---|---|---|---|---|---|---|"]
        for c in claim["checks"]:
            if "effect" not in c:
                lines.append(f"| `{c['arm']}` vs `{c['other']}` | {c['panel']} | - | - | - | - | {c['result']} |")
                continue
            lo, hi = c["ci95"]
            lines.append(f"| `{c['arm']}` vs `{c['other']}` | {c['panel']} | {c['trials']} | {c['arm_only']} / "
                         f"{c['other_only']} | {100 * c['effect']:+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}] points | "
                         f"{c['p_value']:.3g} | {c['result']} |")
        lines.append("")
    done = [r for r in doc["arms"] if r["status"] == "done"]
    if done:
        lines += ["## Training (seed 0)", "", "| Arm | Frames real / synthetic | Final loss | Step time (s) | Train wall (s) |",
                  "|---|---|---|---|---|"]
        for r in done:
            fr = {p: sum(x["frames"] for x in r["data"] if x["pool"] == p) for p in ("real", "synthetic")}
            t = r["train"]
            lines.append(f"| {r['name']} | {fr['real']} / {fr['synthetic']} | {t['final_loss']:.4f} | "
                         f"{t['step_time_s']:.3f} | {t['wall_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- records


def code_commit(where: str | Path) -> dict:
    """The git commit of the checkout holding ``where``, and whether its tracked files differ from it
    (``commit: "unknown"`` outside a git checkout or without git)."""
    import subprocess

    def git(*args):  # --no-optional-locks: `status` leaves the index as it is (the checkout may be another's)
        return subprocess.run(["git", "--no-optional-locks", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=60)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return {"commit": "unknown", "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def _cell_record(cell: str | None) -> dict:
    """The cell by file name and content (a path is the machine's, the content is the cell)."""
    return {"file": None if cell is None else Path(cell).name, "hash": _cell_hash(cell)}


def table_definitions(cfg: ExperimentConfig) -> dict:
    """What a table of this experiment is pooled and judged by, as its records folder keeps it (table.json)."""
    def block(c: ClaimConfig | None):
        return None if c is None else {**to_dict(c), "identity": claim_identity(c)}
    return {"experiment": cfg.name, "task": cfg.task, "code": EXPERIMENT_VERSION, "cell": _cell_record(cfg.cell),
            "panels": {p: {"kind": cfg.eval.panels[p].kind, "n_trials": panel_trials(cfg, p)} for p in cfg.eval.panels},
            "eval_seed": cfg.eval.seed, "training_seed": cfg.train.seed,
            "seeds": sorted(cfg.seeds), "seeded_arms": list(cfg.seeded_arms),
            "arms": [{"name": a.name, "label": a.label} for a in cfg.all_arms()],
            "claim": block(cfg.claim), "look_test": block(cfg.look_test),
            "gap": to_dict(cfg.gap) if cfg.gap else None, "comparisons": [to_dict(c) for c in cfg.comparisons],
            "ood_note": cfg.ood_note}


def _translator(paths: list[str]) -> str | None:
    """The translator that made the arm's translated episodes (their provenance's checkpoint hash), or None."""
    from comsim.io.lerobot import LeRobotDataset

    found = {}
    for path in paths:
        ds = LeRobotDataset(path)
        for i in range(len(ds)):
            h = ds.episode_info(i)["provenance"].translator_hash
            if h:
                found.setdefault(h, path)
    if len(found) > 1:
        raise DatasetError(f"{sorted(found.values())}: episodes made by {len(found)} translators "
                           f"({sorted(found)}): one arm, one translator expected")
    return next(iter(found), None)


def _dataset_records(cfg: ExperimentConfig, fingerprints: dict[str, str]) -> dict[str, str]:
    """What a unit's manifest says of its datasets: {dataset name (a folder's name when it has none): content
    fingerprint}, from ``fingerprints`` keyed by path (``arm_inputs``)."""
    names = {d.path: n for n, d in cfg.datasets.items()}
    return {names.get(path, Path(path).name): fp for path, fp in sorted(fingerprints.items())}


def _panel_records(cfg: ExperimentConfig) -> dict:
    """What a unit's manifest says of each panel it was scored on (``cfg``: the experiment at that seed)."""
    return {p: {"identity": {k: v for k, v in _panel_identity(cfg, p).items() if k != "cell"},
                "n_trials": panel_trials(cfg, p), "eval_key": eval_key(cfg, p), "trials_key": trials_key(cfg, p)}
            for p in cfg.eval.panels}


def arm_manifest(cfg: ExperimentConfig, arm: ArmConfig, seed: int, result: dict,
                 exported_commit: dict | None = None) -> dict:
    """Where one finished (arm, training seed)'s trials come from (``cfg``: the experiment at that seed).
    ``exported_commit``: the commit an earlier export recorded for an arm that recorded none itself."""
    out = Path(result["dir"])
    used = _recorded_inputs(out)["datasets"]
    if (out / COMMIT_FILE).is_file():
        commit = {**json.loads((out / COMMIT_FILE).read_text()), "recorded": "when the arm was trained"}
    elif exported_commit is not None:  # the first export's checkout, not the one the run folder is in today
        commit = exported_commit
    else:  # an arm trained before commits were recorded: the checkout its run folder is in, now
        commit = {**code_commit(out), "recorded": "at export, from the checkout holding the run folder (the arm "
                                                  "recorded no commit)"}
    return {"arm": arm.name, "label": result["label"], "seed": seed, "training_seed": cfg.train.seed,
            "arm_folder": out.name, "code": EXPERIMENT_VERSION, "cell": _cell_record(cfg.cell),
            "datasets": _dataset_records(cfg, used),
            "translator": _translator(sorted(used)),
            "panels": _panel_records(cfg),
            "claim": claim_identity(cfg.claim) if cfg.claim else None,
            "look_test": claim_identity(cfg.look_test) if cfg.look_test else None,
            "train_steps": result["train"]["steps"], "commit": commit}


def recorded_unit(cfg: ExperimentConfig, arm: ArmConfig, seed: int) -> bool:
    """Whether ``cfg.records_dir`` already holds this (arm, training seed)'s trials for these very inputs: the same
    arm folder (its key: data, policy, training), the same content of every dataset it trains on, the same
    experiment code and the same panels. Such a unit is not trained again on a machine whose run folder is gone;
    its committed records stand. ``cfg``: the experiment (any seed)."""
    if not cfg.records_dir:
        return False
    from comsim.pipeline import records

    path = records.unit_dir(cfg.records_dir, arm.name, seed) / records.MANIFEST_FILE
    if not path.is_file():
        return False
    m = json.loads(path.read_text())
    scfg = seed_config(cfg, seed)
    try:
        inputs = arm_inputs(scfg, arm)
    except DatasetError:  # a dataset it trains on is not there: nothing to compare with
        return False
    return (m.get("arm_folder") == Path(arm_run(scfg, arm).output_dir).name
            and m.get("datasets") == _dataset_records(scfg, inputs["datasets"])
            and m.get("code") == EXPERIMENT_VERSION and m.get("panels") == _panel_records(scfg))


def _exported_commit(records_dir, arm: str, seed: int) -> dict | None:
    """The commit an earlier export recorded "at export" for this unit, if any: the checkout may have moved on
    since, and the records already committed must not change with it."""
    from comsim.pipeline import records

    path = records.unit_dir(records_dir, arm, seed) / records.MANIFEST_FILE
    if not path.is_file():
        return None
    commit = json.loads(path.read_text()).get("commit") or {}
    return commit if str(commit.get("recorded", "")).startswith("at export") else None


def export_records(cfg: ExperimentConfig, records_dir: str | Path, units: set[tuple[str, int]] | None = None,
                   log=print) -> dict[str, list[str]]:
    """Write the trial records (``comsim.pipeline.records``) of every finished (arm, training seed) of ``cfg``,
    or of ``units`` only, into ``records_dir``; unfinished or stale ones are skipped (nothing is trained or
    scored). The experiment's relative paths are read from the working directory, as ``run_experiment`` reads
    them. A folder holding another table's records is refused before anything is written."""
    from comsim.pipeline import records

    defs = table_definitions(cfg)
    records.check_definitions(records_dir, defs)
    done, skipped = [], []
    for a in cfg.all_arms():
        for s in arm_seeds(cfg, a):
            if units is not None and (a.name, s) not in units:
                continue
            scfg = seed_config(cfg, s)
            r = finished_arm(scfg, a)
            (done if r else skipped).append((a, s, scfg, r))
    records.write_definitions(records_dir, defs)
    for a, s, scfg, r in done:
        rows = [{"panel": p, **{k: t[k] for k in ("trial", "seed", "success", "box", "steps")}}
                for p, path in _panel_files(scfg, Path(r["dir"])).items() for t in json.loads(path.read_text())["trials"]]
        records.write_unit(records_dir, a.name, s, rows,
                           arm_manifest(scfg, a, s, r, _exported_commit(records_dir, a.name, s)))
        log(f"experiment: trial records of {a.name!r} seed {s} -> {records.unit_dir(records_dir, a.name, s)}")
    return {"written": [f"{a.name}/seed{s}" for a, s, _, _ in done],
            "skipped": [f"{a.name}/seed{s}" for a, s, _, _ in skipped]}


def load_run(policy_dir: str | Path) -> tuple[ExperimentConfig, Path]:
    """The config a finished or running experiment ran with (its results.json) and the folder its relative
    paths are relative to (where it ran from)."""
    from comsim.config import from_dict

    layout = ExperimentLayout(policy_dir)
    if not layout.results.is_file():
        raise ConfigError(f"{layout.results}: expected an experiment's results (no arm has finished there yet, or "
                          "this is not an experiment's output folder)")
    cfg = from_dict(ExperimentConfig, json.loads(layout.results.read_text())["config"], str(layout.results))
    here, out = Path(policy_dir).resolve(), Path(cfg.output_dir)
    if out.is_absolute():
        return cfg, Path.cwd()
    if here.parts[-len(out.parts):] != out.parts:
        raise ConfigError(f"{layout.results}: output_dir {cfg.output_dir!r} is relative, and {here} does not end "
                          "with it: cannot tell where the experiment ran from")
    return cfg, Path(*here.parts[:-len(out.parts)])


def export_run(run: str | Path, records_dir: str | Path, experiment: str | Path | None = None,
               overrides: list[str] | None = None, log=print) -> dict[str, list[str]]:
    """``comsim table export``: the trial records of an experiment's finished arms into ``records_dir``.

    ``run``: the experiment's output folder (the config it ran with is in its results.json) or its YAML (with
    ``overrides``, read from the working directory). ``experiment``: a YAML whose ``comparisons`` replace the
    run's (a run made before they were written down); its claim, look test and gap must be the run's."""
    records_dir = Path(records_dir).resolve()
    if Path(run).is_dir():
        cfg, root = load_run(run)
    else:
        cfg, root = load_experiment(run, overrides), Path.cwd()
    if experiment is not None:
        mine = load_experiment(experiment)
        for name in ("claim", "look_test", "gap"):
            theirs, ours = (to_dict(x) if x else None for x in (getattr(cfg, name), getattr(mine, name)))
            if theirs != ours:
                raise ConfigError(f"{experiment}: {name}: expected the run's own (the pre-registered blocks come from "
                                  f"the run), got another one")
        cfg = dataclasses.replace(cfg, comparisons=mine.comparisons)
    # the run's paths are its own strings (part of its arms' keys): read them from the folder it ran from
    here = Path.cwd()
    os.chdir(root)
    try:
        return export_records(cfg, records_dir, log=log)
    finally:
        os.chdir(here)
