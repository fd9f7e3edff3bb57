"""Training loop of a policy (Diffusion Policy or keypoint policy, (``train/train_policy.py`` and the experiment call it).

    log = train_policy(run)       # run: PolicyRunConfig -> run.output_dir/policy/ (safetensors + config.json)

Determinism: the batch of step k (windows, crops, noise, timesteps) comes from generators
seeded by (seed, k), the model from ``seed``; the same config gives the same weights, and a
run resumed from ``checkpoint-<step>`` (``train.save_every``) continues exactly.
Logged to tensorboard (``output_dir/tb``) and ``output_dir/train_log.json``: loss, learning
rate, the synthetic fraction asked for and the one actually drawn.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.optimization import get_scheduler
from safetensors.torch import load_file, save_file

from comsim.config import to_dict
from comsim.io.files import write_json
from comsim.memory import keep_freed_memory
from comsim.policy.config import PolicyRunConfig
from comsim.policy.data import MixtureDataset
from comsim.policy.base import WEIGHTS_NAME
from comsim.policy.policies import make_policy

LOG_NAME = "train_log.json"


def step_generators(seed: int, step: int) -> tuple[np.random.Generator, torch.Generator]:
    ss = np.random.SeedSequence([int(seed), int(step)])
    return np.random.default_rng(ss), torch.Generator().manual_seed(int(ss.generate_state(1, np.uint64)[0] >> 1))


def train_policy(run: PolicyRunConfig, data: MixtureDataset | None = None, progress: bool = True) -> dict:
    """Train (or find already trained) the policy of ``run``; returns the training log."""
    out = Path(run.output_dir)
    log_path = out / LOG_NAME
    if (out / "policy" / WEIGHTS_NAME).is_file() and log_path.is_file():
        return json.loads(log_path.read_text())
    cfg, t = run.model_config(), run.train
    if t.num_threads:
        torch.set_num_threads(t.num_threads)
    keep_freed_memory()
    data = data or MixtureDataset(run.data, cfg, run.cache_dir)
    torch.manual_seed(t.seed)
    policy = make_policy(cfg, stats=data.stats())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy.to(device).train()
    if t.compile:
        policy.compile()  # in place: parameters and state_dict keys stay the module's own
    opt = torch.optim.AdamW(policy.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    sched = get_scheduler(t.lr_scheduler, opt, num_warmup_steps=min(t.warmup_steps, t.steps),
                          num_training_steps=t.steps)
    ema = None
    if t.ema_decay is not None:
        from diffusers.training_utils import EMAModel
        ema = EMAModel(policy.parameters(), decay=t.ema_decay, use_ema_warmup=True, power=t.ema_power)
    history, start = [], 0
    ckpt = _latest_checkpoint(out)
    if ckpt is not None:
        start, history = _load_checkpoint(ckpt, policy, opt, sched, data, ema)
        print(f"policy: resuming {out} from {ckpt.name}")

    from torch.utils.tensorboard import SummaryWriter
    tb = SummaryWriter(str(out / "tb"))
    t0, cpu0, step_times, window = time.time(), time.process_time(), [], []
    bar = range(start, t.steps)
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(bar, desc=f"train {out.name}", unit="step", initial=start, total=t.steps)
    for step in bar:
        ts = time.perf_counter()
        rng, gen = step_generators(t.seed, step)
        batch = data.sample(t.batch_size, rng)
        try:
            with torch.autocast(device, dtype=torch.bfloat16) if t.precision == "bf16" else contextlib.nullcontext():
                loss = policy.compute_loss(batch, gen)
        except Exception as e:
            if t.compile and step == start:  # the first call compiles
                raise RuntimeError(f"train.compile: torch.compile could not build the policy ({type(e).__name__}: "
                                   f"{str(e)[:300]}); on CPU it needs a C++ compiler (g++). Set train.compile: "
                                   "false to train eagerly.") from e
            raise
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), t.max_grad_norm)
        opt.step()
        sched.step()
        if ema is not None:
            ema.step(policy.parameters())
        step_times.append(time.perf_counter() - ts)
        window.append(loss.item())
        if (step + 1) % t.log_every == 0 or step + 1 == t.steps:
            rec = {"step": step + 1, "loss": float(np.mean(window)), "lr": sched.get_last_lr()[0],
                   "synthetic_fraction": data.synthetic_fraction, "sampled_fraction": data.sampled_fraction}
            history.append(rec)
            window = []
            for k in ("loss", "lr", "synthetic_fraction", "sampled_fraction"):
                tb.add_scalar(f"train/{k}", rec[k], step + 1)
            if progress:
                bar.set_postfix(loss=f"{rec['loss']:.4f}", syn=f"{rec['sampled_fraction']:.3f}")
        if t.save_every and (step + 1) % t.save_every == 0 and step + 1 < t.steps:
            _save_checkpoint(out, step + 1, policy, opt, sched, data, history, ema)
    tb.close()
    steady = step_times[3:] or step_times
    log = {"output_dir": str(out), "steps": t.steps, "batch_size": t.batch_size, "device": device,
           "step_time_s": float(np.median(steady)) if steady else None, "wall_s": time.time() - t0,
           "cpu_s": time.process_time() - cpu0, "threads": torch.get_num_threads(),
           "final_loss": history[-1]["loss"] if history else None, "history": history,
           "mixture": data.summary(), "train": to_dict(t), "policy": cfg.to_dict(),
           "num_parameters": sum(p.numel() for p in policy.parameters())}
    if ema is not None:
        ema.copy_to(policy.parameters())  # the policy that is saved and scored is the average
    policy.eval().save_pretrained(out / "policy", extra={"mixture": data.summary()})
    write_json(log, log_path)  # last: its presence means the run is finished
    for old in out.glob("checkpoint-*"):
        shutil.rmtree(old)
    return log


def _latest_checkpoint(out: Path) -> Path | None:
    done = [p for p in out.glob("checkpoint-*") if (p / "state.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def _save_checkpoint(out: Path, step: int, policy, opt, sched, data: MixtureDataset, history: list, ema=None) -> None:
    tmp = out / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}, str(tmp / WEIGHTS_NAME))
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "ema": ema.state_dict() if ema is not None else None}, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "drawn": data.drawn, "history": history}))
    tmp.rename(out / f"checkpoint-{step}")
    for old in out.glob("checkpoint-*"):
        if old.name != f"checkpoint-{step}":
            shutil.rmtree(old)


def _load_checkpoint(ckpt: Path, policy, opt, sched, data: MixtureDataset, ema=None) -> tuple[int, list]:
    state = json.loads((ckpt / "state.json").read_text())
    policy.load_state_dict(load_file(str(ckpt / WEIGHTS_NAME), device=str(policy.action_min.device)))
    opt_state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
    opt.load_state_dict(opt_state["optimizer"])
    sched.load_state_dict(opt_state["scheduler"])
    if ema is not None:
        ema.load_state_dict(opt_state["ema"])
    data.drawn = dict(state["drawn"])
    return state["step"], state["history"]
