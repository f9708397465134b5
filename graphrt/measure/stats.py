"""The statistics graphrt reports of repeated measurements: median and spread, never a single
sample."""

from __future__ import annotations

from dataclasses import dataclass

from graphrt.quantiles import percentile


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
        s = sorted(samples)  # the mean summed in this order, as it always was: the same figure to the bit
        return cls(median=percentile(s, 50), p10=percentile(s, 10), p90=percentile(s, 90),
                   mean=sum(s) / len(s), n=len(s))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far apart the typical steps are."""
        return (self.p90 - self.p10) / self.median if self.median else 0.0
