"""Why GPUDirect RDMA: the PCIe and DRAM arithmetic of feeding a NIC, and the checkpoint case.

PCIe bytes/s per direction = GT/s × lanes × encoding ÷ 8: 8b/10b for Gen 1–2, 128b/130b for
Gen 3–5 (Gen4 x16 = 31.5 GB/s, Gen5 x16 = 63.0 GB/s), and Gen 6's FLIT mode carries 236 data
bytes per 256 (PCI-SIG PCIe 6.0 spec). Packet overhead takes another 5–15 % (a measured H100
device-to-host copy reached 52.8 GB/s, 0.84 of Gen5 raw).
A 400 Gb/s NIC moves 50 GB/s each way: Gen4 x16 cannot feed it, Gen5 x16 can.
Without GPUDirect RDMA every network byte crosses PCIe twice (GPU → host memory → NIC) and costs
two bytes of DRAM traffic (written, then read) on each side; host DRAM peak = MT/s × 8 B ×
channels × sockets (DDR5-4800, 8 channels, 2 sockets: 614 GB/s), while 8 × 400G NICs at full
duplex without GDR need 1,600 GB/s of DRAM traffic.
Checkpoint case: an async checkpoint first copies GPU state to pinned host memory; the stall is
bytes-per-GPU ÷ device-to-host bandwidth (346 MB ÷ 50 GB/s ≈ 7 ms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
LANES = (1, 2, 4, 8, 16, 32)
ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 236 / 256}


def pcie_bandwidth(gen: int, lanes: int) -> float:
    """Bytes/s per direction before packet (TLP/DLLP) overhead."""
    if gen not in GT_PER_S:
        raise ValueError(f"PCIe generation must be one of {sorted(GT_PER_S)}, got {gen}")
    if lanes not in LANES:
        raise ValueError(f"PCIe lanes must be 1, 2, 4, 8, 16 or 32, got {lanes}")
    return GT_PER_S[gen] * 1e9 * lanes * ENCODING[gen] / 8


@dataclass(frozen=True)
class PcieReport:
    gen: int
    lanes: int
    pcie_Bps_per_direction: float
    pcie_Bps_after_overhead: tuple[float, float]  # 15 % and 5 % packet overhead
    nvme_x4_Bps: float
    nic_bps: float  # bits/s
    nic_Bps: float
    nics: int
    nic_fits: bool
    nic_fits_after_overhead: bool
    dram_peak_Bps: float
    dram_traffic_without_gdr_Bps: float  # all NICs, full duplex
    dram_traffic_with_gdr_Bps: float
    dram_ratio_without_gdr: float  # traffic ÷ peak
    ckpt_bytes_per_gpu: float
    d2h_Bps: float
    ckpt_stall_s: float


def pcie(
    gen: int = 5,
    lanes: int = 16,
    nic_bps: float = 400e9,
    nics: int = 8,
    dram_channels: int = 8,
    sockets: int = 2,
    mts: float = 4800,
    ckpt_bytes_per_gpu: float = 405e9 * 14 / 16_384,
    d2h_Bps: float | None = None,
) -> PcieReport:
    values = (nic_bps, nics, dram_channels, sockets, mts, ckpt_bytes_per_gpu) + (
        (d2h_Bps,) if d2h_Bps is not None else ()
    )
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError("every input must be a positive finite number")
    link = pcie_bandwidth(gen, lanes)
    nic = nic_bps / 8
    dram = mts * 1e6 * 8 * dram_channels * sockets
    # without GDR, per direction each network byte is written to and read from host DRAM
    traffic = nics * nic * 2 * 2
    d2h = d2h_Bps if d2h_Bps is not None else 50e9
    return PcieReport(
        gen=gen,
        lanes=lanes,
        pcie_Bps_per_direction=link,
        pcie_Bps_after_overhead=(link * 0.85, link * 0.95),
        nvme_x4_Bps=pcie_bandwidth(gen, 4),
        nic_bps=nic_bps,
        nic_Bps=nic,
        nics=nics,
        nic_fits=link >= nic,
        nic_fits_after_overhead=link * 0.85 >= nic,
        dram_peak_Bps=dram,
        dram_traffic_without_gdr_Bps=traffic,
        dram_traffic_with_gdr_Bps=0.0,
        dram_ratio_without_gdr=traffic / dram,
        ckpt_bytes_per_gpu=ckpt_bytes_per_gpu,
        d2h_Bps=d2h,
        ckpt_stall_s=ckpt_bytes_per_gpu / d2h,
    )
