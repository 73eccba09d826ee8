"""The torch device a job runs on, from the config's ``device`` (auto, cpu, cuda, cuda:N)."""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU when one is visible, else the CPU; ``cuda`` with no GPU visible is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no GPU is visible to this job")
    return torch.device(device)
