"""The statistics graphrt reports of repeated measurements: median and spread, never a single
sample."""

from __future__ import annotations

from dataclasses import dataclass


def percentile(sorted_samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    if not sorted_samples:
        raise ValueError("no samples")
    k = (len(sorted_samples) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (k - lo)


@dataclass(frozen=True)
class Stats:
    """A distribution of step times, in milliseconds."""

    median: float
    p10: float
    p90: float
    mean: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> "Stats":
        s = sorted(samples)
        return cls(median=percentile(s, 50), p10=percentile(s, 10), p90=percentile(s, 90),
                   mean=sum(s) / len(s), n=len(s))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far apart the typical steps are."""
        return (self.p90 - self.p10) / self.median if self.median else 0.0
