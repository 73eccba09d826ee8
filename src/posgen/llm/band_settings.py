"""The band settings of the band interventions (docs/method.md section 6.4; applied by
posgen.llm.band_interventions): which of a layer's rotating RoPE bands a setting stops or zeroes. Without torch:
posgen.plan counts the settings of a config with :func:`grid`.

A band is a pair of canonical head dims (l, l + d/2) that RoPE turns by ``inv_freq[l]`` per position; the rotating
bands of a layer are those with ``inv_freq > 0``, ordered here from the slowest (lowest frequency) to the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("none", "below", "above", "ablate")
QUARTERS = ("lowest", "second", "third", "highest")


@dataclass(frozen=True)
class BandSetting:
    """One intervention: ``kind`` (:data:`KINDS`), the ``share`` of the rotating bands it stops (below, above), or
    the ``quarter`` it zeroes (ablate)."""

    kind: str
    share: float = 0.0
    quarter: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"band setting {self.kind!r}: not one of {', '.join(KINDS)}")
        if not 0.0 <= self.share <= 1.0 or self.quarter not in range(len(QUARTERS)):
            raise ValueError(f"band setting {self.label}: share in [0, 1], quarter in 0..{len(QUARTERS) - 1}")

    @property
    def label(self) -> str:
        """``none``, ``below-25``, ``above-50``, ``ablate-lowest``: the setting's coordinate in band.nc."""
        if self.kind == "ablate":
            return f"ablate-{QUARTERS[self.quarter]}"
        return self.kind if self.kind == "none" else f"{self.kind}-{round(100 * self.share)}"


def grid(shares=(0.25, 0.5, 0.75), ablate: bool = True) -> list[BandSetting]:
    """The unmodified model, truncation from below and from above at each of ``shares``, and (``ablate``) each
    quarter zeroed."""
    out = [BandSetting("none")]
    out += [BandSetting(kind, share) for kind in ("below", "above") for share in shares]
    return out + ([BandSetting("ablate", quarter=q) for q in range(len(QUARTERS))] if ablate else [])


def band_masks(inv_freq: np.ndarray, setting: BandSetting) -> tuple[np.ndarray, np.ndarray]:
    """(stop, zero): (band,) booleans of one layer's canonical table ``inv_freq`` (band,): the bands that stop
    rotating and the bands whose components are zeroed under ``setting``."""
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    rotating = np.flatnonzero(inv_freq > 0)
    slow_first = rotating[np.argsort(inv_freq[rotating], kind="stable")]  # (n,) lowest frequency first
    n = slow_first.size
    stop, zero = np.zeros(inv_freq.size, bool), np.zeros(inv_freq.size, bool)
    count = int(round(setting.share * n))
    if setting.kind == "below":
        stop[slow_first[:count]] = True
    elif setting.kind == "above":
        stop[slow_first[n - count :]] = True
    elif setting.kind == "ablate":
        edges = np.linspace(0, n, len(QUARTERS) + 1).round().astype(int)  # quarters of the rotating bands
        zero[slow_first[edges[setting.quarter] : edges[setting.quarter + 1]]] = True
    return stop, zero


def layer_masks(inv_freq: np.ndarray, setting: BandSetting) -> tuple[np.ndarray, np.ndarray]:
    """(stop, zero): (layer, band) booleans of every layer of the canonical table ``inv_freq`` (layer, band) under
    ``setting`` (:func:`band_masks` of each layer)."""
    masks = [band_masks(row, setting) for row in np.asarray(inv_freq)]
    return np.stack([stop for stop, _ in masks]), np.stack([zero for _, zero in masks])
