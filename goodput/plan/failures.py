"""Failure rates: the Llama 3 interruption table, job MTBI, per-GPU MTBF, and scaling with N.

Source: Dubey et al., "The Llama 3 Herd of Models" (2024), §3.3.4 and Table 5: 466 job
interruptions in a 54-day snapshot of 405B pre-training on 16,384 H100 GPUs, 47 planned and 419
unexpected. The table's counts sum to 419, but its printed percentages sum to 94.9 %
(148/419 is 35.3 %, printed 30.1 %): we keep both columns and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
LLAMA3_PLANNED = 47


@dataclass(frozen=True)
class Cause:
    name: str
    component: str
    count: int
    printed_pct: float  # as printed in Table 5


LLAMA3_TABLE5: tuple[Cause, ...] = (
    Cause("Faulty GPU", "GPU", 148, 30.1),
    Cause("GPU HBM3 Memory", "GPU", 72, 17.2),
    Cause("Software Bug", "Dependency", 54, 12.9),
    Cause("Network Switch/Cable", "Network", 35, 8.4),
    Cause("Host Maintenance", "Unplanned Maintenance", 32, 7.6),
    Cause("GPU SRAM Memory", "GPU", 19, 4.5),
    Cause("GPU System Processor", "GPU", 17, 4.1),
    Cause("NIC", "Host", 7, 1.7),
    Cause("NCCL Watchdog Timeouts", "Unknown", 7, 1.7),
    Cause("Silent Data Corruption", "GPU", 6, 1.4),
    Cause("GPU Thermal Interface + Sensor", "GPU", 6, 1.4),
    Cause("SSD", "Host", 3, 0.7),
    Cause("Power Supply", "Host", 3, 0.7),
    Cause("Server Chassis", "Host", 2, 0.5),
    Cause("IO Expansion Board", "Host", 2, 0.5),
    Cause("Dependency", "Dependency", 2, 0.5),
    Cause("CPU", "Host", 2, 0.5),
    Cause("System Memory", "Host", 2, 0.5),
)


@dataclass(frozen=True)
class FailureReport:
    causes: tuple[Cause, ...]
    total: int
    printed_pct_sum: float
    recomputed_pct: tuple[float, ...]
    job_mtbi_s: float  # Llama 3's own job MTBI
    gpu_mtbf_s: float  # per-GPU MTBF (given, or implied by Llama 3)
    gpus: int  # the GPU count MTBI is scaled to
    mtbi_s: float  # job MTBI at ``gpus`` GPUs: gpu_mtbf / gpus


def job_mtbi(window_s: float = LLAMA3_DAYS * 86400.0, interruptions: int = LLAMA3_UNEXPECTED) -> float:
    """Mean time between interruptions of one job: window / count (54 d / 419 = 3.09 h)."""
    if interruptions <= 0:
        raise ValueError("interruptions must be positive")
    return window_s / interruptions


def gpu_mtbf_from_job(mtbi_s: float, gpus: int) -> float:
    """If every GPU fails independently at rate 1/m, a job on N GPUs sees M = m / N."""
    return mtbi_s * gpus


def mtbi_at(gpu_mtbf_s: float, gpus: int) -> float:
    if gpus <= 0 or gpu_mtbf_s <= 0:
        raise ValueError("gpus and per-GPU MTBF must be positive")
    return gpu_mtbf_s / gpus


def failures(gpus: int | None = None, gpu_mtbf_s: float | None = None) -> FailureReport:
    total = sum(c.count for c in LLAMA3_TABLE5)
    m_job = job_mtbi()
    m_gpu = gpu_mtbf_s if gpu_mtbf_s is not None else gpu_mtbf_from_job(m_job, LLAMA3_GPUS)
    n = gpus if gpus is not None else LLAMA3_GPUS
    return FailureReport(
        causes=LLAMA3_TABLE5,
        total=total,
        printed_pct_sum=round(sum(c.printed_pct for c in LLAMA3_TABLE5), 1),
        recomputed_pct=tuple(100.0 * c.count / total for c in LLAMA3_TABLE5),
        job_mtbi_s=m_job,
        gpu_mtbf_s=m_gpu,
        gpus=n,
        mtbi_s=mtbi_at(m_gpu, n),
    )
