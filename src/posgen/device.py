"""The torch device a job runs on, from the config's ``device`` (auto, cpu, cuda, cuda:N)."""

from __future__ import annotations

import functools

import torch


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU when one is visible, else the CPU; ``cuda`` with no GPU visible is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no GPU is visible to this job")
    return torch.device(device)


def constant(values, dtype: torch.dtype, device) -> torch.Tensor:
    """A small constant (an index list, entry counts) on ``device``, made once per value and device: made from host
    data at every use, each would be a blocking host-to-device copy on a GPU. Read it, never write to it."""
    return _constant(tuple(values), dtype, torch.device(device))


@functools.lru_cache(maxsize=512)
def _constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


class PrecisionError(RuntimeError):
    """A setting lets float32 products round below float32 (TF32, bfloat16), which the analysis cannot allow."""


def reduced_precision_settings() -> list[str]:
    """The settings in force that let float32 matrix products round to TF32 (or bfloat16 on a CPU's oneDNN): each
    named as a user sets it. Empty: every float32 product is a float32 product."""
    import os

    found = []
    if torch.backends.cuda.matmul.allow_tf32:
        found.append("torch.backends.cuda.matmul.allow_tf32 = True")
    if torch.get_float32_matmul_precision() != "highest":
        found.append(f"torch.set_float32_matmul_precision({torch.get_float32_matmul_precision()!r})")
    if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0") not in ("", "0"):
        found.append(f"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE={os.environ['TORCH_ALLOW_TF32_CUBLAS_OVERRIDE']}")
    return found


def require_full_precision(what: str = "the decomposition") -> None:
    """Refuse, in one line naming the setting, to run ``what`` where float32 products may round to TF32: its
    statistics are checked to 1e-5 against float64 (docs/method.md section 4, "Precision"), which TF32's 10-bit
    mantissa cannot give. (cuDNN's own TF32 flag governs convolutions, which the analysis does not use.)"""
    found = reduced_precision_settings()
    if found:
        raise PrecisionError(
            f"{what} needs full float32 products, but {'; '.join(found)} lets them round to TF32: unset it for "
            "the analysis"
        )
