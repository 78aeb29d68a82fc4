"""RouteLLM's matrix-factorisation router (Ong et al., 2024), re-implemented for two models (SLM weak, LLM strong).

Request level: before any decoding, the router scores the query and the chosen model answers the whole query; a
query goes to the LLM when its estimated win rate >= α. Query embeddings come from a local encoder (by default the
SLM itself). The model, its training labels, the calibration of α and the embeddings: docs/internals.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


class MFModel(nn.Module):
    """Two-model MF scorer: model embeddings P, a bias-free text projection and a bias-free classifier."""

    def __init__(self, text_dim: int, dim: int = 16, num_models: int = 2):
        super().__init__()
        self.P = nn.Embedding(num_models, dim)
        self.text_proj = nn.Linear(text_dim, dim, bias=False)
        self.classifier = nn.Linear(dim, 1, bias=False)

    def score(self, model_id: int, emb: torch.Tensor) -> torch.Tensor:
        v = nn.functional.normalize(self.P.weight[model_id], p=2, dim=-1)
        return self.classifier(v * self.text_proj(emb)).squeeze(-1)

    def logit_llm_wins(self, emb: torch.Tensor) -> torch.Tensor:
        return self.score(1, emb) - self.score(0, emb)  # model 0 = SLM (weak), 1 = LLM (strong)


@dataclass
class MFRouter:
    model: MFModel
    mean: torch.Tensor
    std: torch.Tensor
    meta: dict

    @torch.no_grad()
    def win_rate(self, emb: torch.Tensor) -> list[float]:
        """P(LLM wins) for each query embedding (rows of `emb`)."""
        x = (emb.float() - self.mean) / self.std
        return torch.sigmoid(self.model.logit_llm_wins(x).double()).tolist()  # float64: no ties at 1.0

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"state": self.model.state_dict(), "mean": self.mean, "std": self.std}, path / "router.pt")
        (path / "router.json").write_text(json.dumps(self.meta, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> MFRouter:
        path = Path(path)
        meta = json.loads((path / "router.json").read_text())
        blob = torch.load(path / "router.pt", weights_only=True)
        model = MFModel(meta["text_dim"], meta["dim"])
        model.load_state_dict(blob["state"])
        return cls(model.eval(), blob["mean"], blob["std"], meta)


def make_labels(slm_correct: list[bool], llm_correct: list[bool], ties: str = "drop") -> tuple[list[int], list[int]]:
    """(indices kept, labels: 1 = LLM wins, 0 = SLM wins)."""
    if ties not in ("drop", "prefer_slm"):
        raise ValueError(f"ties={ties!r}: use 'drop' (RouteLLM) or 'prefer_slm' (both right counts as an SLM win)")
    if len(slm_correct) != len(llm_correct):
        raise ValueError("slm_correct and llm_correct must have one entry per training query")
    idx, lab = [], []
    for i, (s, g) in enumerate(zip(slm_correct, llm_correct)):
        if g and not s:
            idx.append(i), lab.append(1)
        elif s and (not g or ties == "prefer_slm"):
            idx.append(i), lab.append(0)
    return idx, lab


def train_mf(
    emb: torch.Tensor,
    labels: list[int],
    dim: int = 16,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    seed: int = 0,
    meta: dict | None = None,
) -> MFRouter:
    """Fit the MF router by full-batch Adam on binary cross-entropy; both label classes must be present."""
    n_llm = sum(labels)
    if len(labels) != emb.shape[0]:
        raise ValueError("one label per embedding row is required")
    if n_llm == 0 or n_llm == len(labels):
        raise ValueError(
            f"RouteLLM-MF needs both LLM wins and SLM wins in the training pool (got {n_llm} LLM wins "
            f"of {len(labels)} decided pairs); use a larger train pool or ties='prefer_slm'"
        )
    torch.manual_seed(seed)
    x = emb.float()
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    x = (x - mean) / std
    y = torch.tensor(labels, dtype=torch.float)
    model = MFModel(x.shape[1], dim)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(model.logit_llm_wins(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = (model.logit_llm_wins(x) > 0).float()
    info = {
        "text_dim": int(x.shape[1]),
        "dim": dim,
        "n_labels": len(labels),
        "n_llm_wins": int(n_llm),
        "train_loss": float(loss.detach()),
        "train_acc": float((pred == y).float().mean()),
    }
    return MFRouter(model.eval(), mean, std, {**(meta or {}), **info})


def calibrate_alpha(win_rates: list[float], share: float) -> float:
    """The threshold α that sends a `share` of the calibration queries to the LLM (win rate >= α)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"target LLM share {share} must be in [0, 1]")
    if not win_rates:
        raise ValueError("calibration needs at least one win rate")
    if share <= 0:
        return float(max(win_rates)) + 1e-9
    ranked = sorted(win_rates, reverse=True)
    return float(ranked[max(0, min(len(ranked), round(share * len(ranked))) - 1)])


@torch.no_grad()
def embed_texts(model, tokenizer, texts: list[str], batch_size: int = 32) -> torch.Tensor:
    """Mean-pooled last hidden states of a causal LM (the default encoder: the SLM itself)."""
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(dev) for k, v in enc.items()}
        hs = model(**enc, output_hidden_states=True).hidden_states[-1].float()
        m = enc["attention_mask"].unsqueeze(-1).float()
        out.append(((hs * m).sum(1) / m.sum(1).clamp(min=1)).cpu())
    return torch.cat(out) if out else torch.zeros(0, model.config.hidden_size)
