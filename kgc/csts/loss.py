"""The C-STS objective, whole, in one module.

* MSE between the cosine φ = cos(g(s1 | c), g(s2 | c)) and the label scaled to [0, 1], (y − 1) / 4
  (C-STS, Deshpande et al. 2023; CSR);
* Hyper-CL's contrastive term over the two conditions of one sentence pair (Yoo et al. 2024):
  −log( e^{φ(c_high)/τ} / (e^{φ(c_high)/τ} + e^{φ(c_low)/τ}) ) = softplus((φ(c_low) − φ(c_high)) / τ),
  averaged over the batch's contrast pairs; Hyper-CL adds it with weight 1 and τ ∈ {1.5, 1.7, 1.9}.

loss = ``mse_weight`` · MSE + ``contrastive_weight`` · contrastive (when ``contrastive``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kgc.training.objective import Objective


def scale_label(label: torch.Tensor) -> torch.Tensor:
    """C-STS labels 1–5 → targets for a cosine, 0–1."""
    return (label - 1.0) / 4.0


class CSTSLoss(Objective):
    def __init__(self, *, mse_weight: float = 1.0, contrastive: bool = True, contrastive_weight: float = 1.0,
                 contrastive_temperature: float = 1.9) -> None:
        super().__init__()
        self.mse_weight, self.contrastive = mse_weight, contrastive
        self.contrastive_weight, self.tau = contrastive_weight, contrastive_temperature

    def forward(self, cosine: torch.Tensor, label: torch.Tensor, high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        """cosine, label (batch,) with labels 1–5; high, low (pairs,) row indices, label[high] > label[low]."""
        loss = self.mse_weight * F.mse_loss(cosine, scale_label(label))
        if self.contrastive and len(high):
            loss = loss + self.contrastive_weight * F.softplus((cosine[low] - cosine[high]) / self.tau).mean()
        return loss
