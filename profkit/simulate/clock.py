"""Per-host clock skew: what each rank's profiler would write instead of the true time.

Convention (also written into truth.json as ``convention``)::

    host_ns = true_ns + offset_ns[rank] + round(drift_ppm[rank] * 1e-6 * (true_ns - t0_ns))

so ``offset_ns`` is what must be SUBTRACTED from a rank's timestamps at ``t0_ns`` to get true
time, and the remainder ``drift_ppm * 1e-6 * (true_ns - t0_ns)`` grows over the capture. Ranks
on one host share its clock; host 0 (rank 0's) is the reference with offset 0 and drift 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONVENTION = (
    "host_ns = true_ns + offset_ns[rank] + round(drift_ppm[rank] * 1e-6 * (true_ns - t0_ns)); "
    "every timestamp a rank's trace holds (Kineto: baseTimeNanoseconds + round(ts*1000); "
    "nsys: utcEpochNs + start) is host_ns. Undo: true_ns = t0_ns + (host_ns - offset_ns - t0_ns) "
    "/ (1 + drift_ppm * 1e-6), exact to +-1 ns. Host 0 (rank 0's) is the reference: offset 0, drift 0."
)


@dataclass(frozen=True)
class HostClock:
    offset_ns: int
    drift_ppm: float
    t0_ns: int

    def to_host(self, true_ns: np.ndarray) -> np.ndarray:
        """True int64 ns -> this host's clock (int64 ns)."""
        true_ns = np.asarray(true_ns, dtype=np.int64)
        if self.drift_ppm == 0.0:
            return true_ns + self.offset_ns
        drift = np.rint((true_ns - self.t0_ns).astype(np.float64) * (self.drift_ppm * 1e-6)).astype(np.int64)
        return true_ns + self.offset_ns + drift

    def to_true(self, host_ns: np.ndarray) -> np.ndarray:
        """Inverse of ``to_host`` (exact to +-1 ns)."""
        host_ns = np.asarray(host_ns, dtype=np.int64)
        rel = (host_ns - self.offset_ns - self.t0_ns).astype(np.float64) / (1.0 + self.drift_ppm * 1e-6)
        return self.t0_ns + np.rint(rel).astype(np.int64)


def host_clocks(seed: int, hosts: int, offset_ms_max: float, drift_ppm_max: float, t0_ns: int) -> list[HostClock]:
    """One seeded clock per host; host 0 is the reference."""
    rng = np.random.default_rng([seed, 0xC10C])
    offsets = rng.uniform(-offset_ms_max * 1e6, offset_ms_max * 1e6, size=hosts)
    drifts = rng.uniform(-drift_ppm_max, drift_ppm_max, size=hosts)
    clocks = []
    for h in range(hosts):
        if h == 0:
            clocks.append(HostClock(0, 0.0, t0_ns))
        else:
            clocks.append(HostClock(int(round(offsets[h])), round(float(drifts[h]), 3), t0_ns))
    return clocks
