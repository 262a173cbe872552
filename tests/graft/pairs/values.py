"""Random values for a built model, away from the values a default init gives."""

from __future__ import annotations

import torch
from torch import nn


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random values everywhere, norms (and weight norms' magnitudes) away from 1 and 0, so that a
    swap or a drop shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            leaf = name.rpartition(".")[2]
            norm = tensor.ndim == 1 and leaf in ("weight", "scale", "gamma")
            # a weight norm's magnitude (old and new names): each output channel's norm
            magnitude = leaf in ("weight_g", "original0")
            if leaf in ("running_var", "logit_scale") or norm or magnitude:
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
            elif ("positional_embedding" in name and "encoder" in name) or leaf == "inv_freq":
                continue  # computed constants (whisper's sinusoids, rotary frequencies)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.1)
    return model.eval()



def drawn(model: nn.Module) -> nn.Module:
    """Every parameter drawn from N(0, 0.3) after ``torch.manual_seed(1)``: a small model's
    values far enough from its init that a wrong pairing shows in its outputs."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()
