"""CLIP scores, only where CLIP weights are on disk (never downloaded).

- ``clip_score``: text-video agreement, the mean over frames of ``100 * max(cos(image, text), 0)``
  (Hessel et al.'s CLIPScore without the 2.5 factor, as torchmetrics' ``CLIPScore``),
  with the episode's task string as the text.
- ``clip_similarity``: ``100 * cos`` between the embeddings of paired predicted and
  reference frames, averaged over frames.

``ClipScorer(path)`` loads a Hugging Face ``transformers`` CLIP folder (``config.json``,
weights, tokenizer and image-processor files, as ``save_pretrained`` writes them) with
``local_files_only=True``. Without ``transformers`` or without a folder the metric is
``MetricUnavailable`` and the evaluation reports it as null with the reason.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from comsim.metrics.frechet import MetricUnavailable


class ClipScorer:
    def __init__(self, path: str | Path, device: str | torch.device = "cpu", batch_size: int = 32):
        try:
            from transformers import CLIPModel, CLIPProcessor
        except ImportError as e:
            raise MetricUnavailable("CLIP: the transformers package is not installed "
                                    "(`pip install transformers`)") from e
        self.path = Path(path).expanduser()
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"{self.path / 'config.json'}: file not found (CLIP weights must be a local "
                                    "transformers CLIP folder, as save_pretrained writes it)")
        try:
            self.model = CLIPModel.from_pretrained(self.path, local_files_only=True).eval().to(device)
            self.processor = CLIPProcessor.from_pretrained(self.path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.path}: not a loadable transformers CLIP folder ({e})") from e
        self.device, self.batch_size = torch.device(device), batch_size

    @torch.inference_mode()
    def image_embeddings(self, frames: np.ndarray) -> torch.Tensor:
        """uint8 (T, H, W, 3) -> unit-norm (T, D)."""
        out = []
        for i in range(0, len(frames), self.batch_size):
            inputs = self.processor(images=list(frames[i:i + self.batch_size]), return_tensors="pt")
            emb = self.model.get_image_features(pixel_values=inputs["pixel_values"].to(self.device))
            out.append(_unit(_tensor(emb)))
        return torch.cat(out)

    @torch.inference_mode()
    def text_embedding(self, text: str) -> torch.Tensor:
        inputs = self.processor(text=[text], return_tensors="pt", padding=True, truncation=True)
        emb = self.model.get_text_features(input_ids=inputs["input_ids"].to(self.device),
                                           attention_mask=inputs["attention_mask"].to(self.device))
        return _unit(_tensor(emb))[0]

    def clip_score(self, frames: np.ndarray, text: str) -> np.ndarray:
        """Per-frame ``100 * max(cos, 0)`` against ``text``."""
        cos = self.image_embeddings(frames) @ self.text_embedding(text)
        return (100 * cos.clamp(min=0)).double().cpu().numpy()

    def clip_similarity(self, pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
        """Per-frame ``100 * cos`` between paired frames."""
        cos = (self.image_embeddings(pred) * self.image_embeddings(ref)).sum(-1)
        return (100 * cos).double().cpu().numpy()


def _tensor(x) -> torch.Tensor:
    # transformers 5 may return a model output object instead of the tensor
    return x if isinstance(x, torch.Tensor) else getattr(x, "pooler_output", x[0])


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
