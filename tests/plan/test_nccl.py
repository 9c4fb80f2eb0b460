"""goodput.plan.nccl: transport and GPUDirect RDMA per NCCL connection line.

All log lines here are synthetic, written from NCCL's format strings (src/transport/net.cc, p2p.cc,
shm.cc, coll_net.cc, src/graph/topo.cc); hosts, ranks and devices are made up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput.plan.nccl import Connection, NcclReport, parse_nccl_log

P = "gpu-a-01:4242:4300 [3] NCCL INFO "  # the usual host:pid:tid [dev] prefix
Q = "gpu-b-07:5151:5199 [0] NCCL INFO "

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "nccl-logs" / "samples.log"


def one(line: str) -> Connection:
    report = parse_nccl_log(line)
    assert len(report.connections) == 1, report.connections
    return report.connections[0]


# --- NET lines ---------------------------------------------------------------------------------


def test_current_channel_format_send_with_gdr():
    c = one(P + "Channel 05/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA")
    assert (c.channel, c.conn_index, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev) == (5, 0, 3, 3, 11, 3)
    assert (c.direction, c.transport, c.net, c.device, c.proxy_rank) == ("send", "NET", "IB", 3, None)
    assert c.gdr and c.inter_node
    assert c.detail == "NET/IB/3/GDRDMA"
    assert c.host == "gpu-a-01"
    assert c.line_no == 1
    assert not c.dev_is_bus_id


def test_receive_without_gdr_is_staged():
    c = one(P + "Channel 02/0 : 12[4] -> 4[4] [receive] via NET/IB/1")
    assert (c.direction, c.net, c.device, c.gdr, c.inter_node) == ("receive", "IB", 1, False, True)
    assert c.src_rank == 12 and c.dst_rank == 4


def test_ibext_plugin_name_and_suffixes():
    c = one(Q + "Channel 13/1 : 0[0] -> 9[1] [send] via NET/IBext_v8/4/GDRDMA(PCI)/Shared")
    assert (c.net, c.device, c.gdr, c.conn_index) == ("IBext_v8", 4, True, 1)
    assert c.detail == "NET/IBext_v8/4/GDRDMA(PCI)/Shared"
    c = one(Q + "Channel 13/1 : 0[0] -> 9[1] [send] via NET/IB/0/Shared")
    assert (c.net, c.gdr) == ("IB", False)


def test_pxn_proxy_form():
    c = one(Q + "Channel 01/0 : 6[6] -> 14[6] [send] via NET/IBext/1(2)/GDRDMA")
    assert (c.net, c.device, c.proxy_rank, c.gdr) == ("IBext", 1, 2, True)
    c = one(Q + "Channel 01/0 : 6[6] -> 14[6] [send] via NET/IB/0(7)")
    assert (c.net, c.device, c.proxy_rank, c.gdr) == ("IB", 0, 7, False)


def test_plugin_names_with_spaces():
    c = one(P + "Channel 00/0 : 1[1] -> 9[1] [receive] via NET/AWS Libfabric/1/GDRDMA")
    assert (c.net, c.device, c.gdr) == ("AWS Libfabric", 1, True)
    c = one(P + "Channel 03/0 : 1[1] -> 9[1] [send] via NET/NCCL RDMA Plugin v10/0")
    assert (c.net, c.device, c.gdr) == ("NCCL RDMA Plugin v10", 0, False)
    c = one(P + "Channel 03/0 : 1[1] -> 9[1] [send] via NET/OFI/2/GDRDMA")
    assert (c.net, c.device, c.gdr) == ("OFI", 2, True)


def test_socket_is_tcp():
    c = one(P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/1")
    assert (c.transport, c.net, c.device, c.gdr, c.inter_node) == ("NET", "Socket", 1, False, True)


def test_trailing_text_after_the_token_is_ignored():
    c = one(P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/2/GDRDMA comm 0x55d0 nRanks 16")
    assert (c.detail, c.gdr) == ("NET/IB/2/GDRDMA", True)


def test_old_bus_id_brackets():
    c = one("old-host:77:78 [1] NCCL INFO Channel 04 : 5[b2000] -> 13[1a000] [send] via NET/IB/2/GDRDMA")
    assert c.dev_is_bus_id
    assert (c.src_dev, c.dst_dev) == (0xB2000, 0x1A000)
    assert (c.channel, c.conn_index, c.gdr) == (4, None, True)


def test_ring_format_of_very_old_releases():
    c = one("old-host:77:78 [2] NCCL INFO Ring 01 : 17 -> 18 [receive] via NET/IB/0/GDRDMA")
    assert (c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev) == (1, 17, None, 18, None)
    assert (c.direction, c.gdr, c.inter_node) == ("receive", True, True)
    c = one("old-host:77:78 [2] NCCL INFO Ring 00 : 2[2] -> 3[3] via P2P/IPC")
    assert (c.transport, c.inter_node, c.direction) == ("P2P", False, "")
    c = one("old-host:77:78 [2] NCCL INFO Ring 00 : 2[2] -> 3[3] via direct shared memory")
    assert c.transport == "SHM"


def test_collnet_lines():
    c = one(P + "CollNet 00/0 : 3 [send] via COLLNET/IBext/0/GDRDMA")
    assert (c.transport, c.net, c.device, c.gdr, c.inter_node) == ("COLLNET", "IBext", 0, True, True)
    assert (c.src_rank, c.dst_rank, c.direction) == (3, None, "send")
    c = one(P + "Coll 01 : 5 [receive] via COLLNET/SHARP/1")
    assert (c.transport, c.net, c.gdr, c.channel, c.direction) == ("COLLNET", "SHARP", False, 1, "receive")


# --- intra-node lines ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "detail", "proxy"),
    [
        ("P2P/direct pointer", "P2P/direct pointer", None),
        ("P2P/direct pointer/read", "P2P/direct pointer/read", None),
        ("P2P/CUMEM", "P2P/CUMEM", None),
        ("P2P/CUMEM/read", "P2P/CUMEM/read", None),
        ("P2P/CUMEM/CE", "P2P/CUMEM/CE", None),
        ("P2P/MNNVL/read", "P2P/MNNVL/read", None),
        ("P2P/IPC", "P2P/IPC", None),
        ("P2P/IPC/read", "P2P/IPC/read", None),
        ("P2P/indirect/2[2]", "P2P/indirect/2[2]", 2),
        ("P2P/indirect/6[6]/read", "P2P/indirect/6[6]/read", 6),
    ],
)
def test_p2p_variants(token, detail, proxy):
    c = one(P + f"Channel 07/1 : 1[1] -> 5[5] via {token}")
    assert (c.transport, c.detail, c.proxy_rank, c.gdr, c.inter_node, c.direction) == (
        "P2P",
        detail,
        proxy,
        False,
        False,
        "",
    )
    assert c.net is None and c.device is None


@pytest.mark.parametrize("token", ["SHM/direct", "SHM/direct/direct", "SHM/CE/direct"])
def test_shm_old_and_new(token):
    c = one(P + f"Channel 00 : 4[4] -> 0[0] via {token}")
    assert (c.transport, c.detail, c.gdr, c.inter_node) == ("SHM", token, False, False)


def test_unknown_transport_is_kept():
    c = one(P + "Channel 00/0 : 0[0] -> 1[1] via NVLS/whatever")
    assert (c.transport, c.inter_node, c.gdr) == ("NVLS", False, False)


# --- prefixes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "host"),
    [
        ("node-3:100:200 [1] NCCL INFO ", "node-3"),
        ("[5] node-3:100:200 [1] NCCL INFO ", "node-3"),  # mpirun/torchrun rank tag
        ("2025-03-04 10:11:12,345 node-3:100:200 [1] NCCL INFO ", "node-3"),
        ("[2025-03-04T10:11:12.345Z] node-3:100:200 [1] NCCL INFO ", "node-3"),
        ("[1,5]<stdout>:node-3:100:200 [1] NCCL INFO ", "node-3"),  # OpenMPI --tag-output
        ("5: node-3:100:200 [1] NCCL INFO ", "node-3"),  # srun -l
        ("<redacted>:100:200 [1] NCCL INFO ", "<redacted>"),
        ("NCCL INFO ", None),
        ("", None),
    ],
)
def test_prefixes(prefix, host):
    c = one(prefix + "Channel 02/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA")
    assert c.host == host
    assert (c.src_rank, c.dst_rank, c.gdr) == (8, 0, True)


def test_garbage_lines_are_ignored_and_never_raise():
    text = "\n".join(
        [
            "",
            "random text via nothing",
            P + "Channel 00/24 :    0   1   2   3   4   5   6   7",  # ring order, not a connection
            P + "Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
            P + "Channel 00/0 : 0[0] -> via NET/IB/0",  # truncated
            P + "Channel 00/0 : " + "9" * 5000 + "[0] -> 1[1] via P2P/IPC",
            P + "NET/IB : GPU Direct RDMA Enabled for HCA x 'mlx5_0'",
            "\x00\x1b[31mbinary\xff junk",
            P + "Connected all rings",
            P + "Channel 00/0 : 0[0] -> 1[1] via",
            "via NET/",
        ]
    )
    report = parse_nccl_log(text)
    assert report.connections == []
    assert report.hca == []
    assert report.inter_node == 0
    assert "no NCCL connection lines found" in report.verdict


def test_one_connection_per_line_no_dedup():
    line = P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA"
    report = parse_nccl_log("\n".join([line, line, "noise", line]))
    assert [c.line_no for c in report.connections] == [1, 2, 4]
    assert report.inter_node == 3 and report.inter_node_gdr == 3


# --- HCA lines, version, env -------------------------------------------------------------------


def test_hca_gdr_lines():
    text = "\n".join(
        [
            P + "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
            P + "NET/IB : GPU Direct RDMA Disabled for HCA 3 'mlx5_3'",
            Q + "NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)",
            Q + "NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 2 'rocep1s0f0'",
            Q + "NET/AWS Libfabric : GPU Direct RDMA Enabled for HCA 0 'rdmap16s27'",
        ]
    )
    hca = parse_nccl_log(text).hca
    assert [(h.hca_index, h.name, h.enabled, h.host, h.net) for h in hca] == [
        (0, "mlx5_0", True, "gpu-a-01", "IB"),
        (3, "mlx5_3", False, "gpu-a-01", "IB"),
        (1, "mlx5_1", False, "gpu-b-07", "IB"),
        (2, "rocep1s0f0", True, "gpu-b-07", "IB"),
        (0, "rdmap16s27", True, "gpu-b-07", "AWS Libfabric"),
    ]
    assert hca[2].qualifier == "(no module)"
    assert hca[3].qualifier == "(DMABUF)"


def test_version_and_env():
    text = "\n".join(
        [
            P + "NCCL version 2.21.5+cuda12.4",
            P + "NCCL_IB_HCA set by environment to mlx5_0,mlx5_3",
            P + "NCCL_NET_GDR_LEVEL set by environment to LOC",
            P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0",
            Q + "NCCL version 2.21.5+cuda12.4",
        ]
    )
    report = parse_nccl_log(text)
    assert report.nccl_version == "2.21.5+cuda12.4"
    assert report.env == {"NCCL_IB_HCA": "mlx5_0,mlx5_3", "NCCL_NET_GDR_LEVEL": "LOC"}
    assert any("NCCL_NET_GDR_LEVEL" in a and "LOC" in a and "disables" in a for a in report.advice)
    assert not any("Several NCCL versions" in a for a in report.advice)


def test_mixed_versions_are_flagged():
    report = parse_nccl_log(P + "NCCL version 2.18.1+cuda12.1\n" + Q + "NCCL version 2.19.3+cuda12.2\n")
    assert report.nccl_version == "2.18.1+cuda12.1"
    assert report.nccl_versions == ["2.18.1+cuda12.1", "2.19.3+cuda12.2"]
    assert any("Several NCCL versions" in a for a in report.advice)


# --- verdicts and advice ----------------------------------------------------------------------------


def test_all_gdr_verdict():
    text = "\n".join(
        [
            P + "NCCL version 2.23.4+cuda12.6",
            P + "Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA",
            P + "Channel 00/0 : 11[3] -> 3[3] [receive] via NET/IB/3/GDRDMA",
            P + "Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
        ]
    )
    report = parse_nccl_log(text)
    assert (report.inter_node, report.inter_node_gdr) == (2, 2)
    assert report.verdict == "all 2 inter-node connections use GPUDirect RDMA"
    assert report.advice == []


def test_staged_with_disabled_hca_points_at_peermem():
    text = "\n".join(
        [
            P + "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'",
            P + "Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/0",
            P + "Channel 00/0 : 11[3] -> 3[3] [receive] via NET/IB/0",
        ]
    )
    report = parse_nccl_log(text)
    assert (report.inter_node, report.inter_node_gdr) == (2, 0)
    assert report.verdict.startswith("2 of 2 inter-node connections do not use GPUDirect RDMA")
    assert "NET/IB without /GDRDMA: staged through host memory" in report.verdict
    joined = " ".join(report.advice)
    assert "nvidia-peermem" in joined and "mlx5_0" in joined
    assert "NCCL_NET_GDR_LEVEL" not in joined  # the HCA line already names the cause


def test_staged_with_enabled_hca_points_at_topology():
    text = "\n".join(
        [
            P + "NET/IB : GPU Direct RDMA Enabled for HCA 1 'mlx5_1'",
            P + "Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/1",
            P + "Channel 00/0 : 11[3] -> 3[3] [receive] via NET/IB/1/GDRDMA",
        ]
    )
    report = parse_nccl_log(text)
    assert (report.inter_node, report.inter_node_gdr) == (2, 1)
    joined = " ".join(report.advice)
    assert "NCCL_NET_GDR_LEVEL" in joined and "nvidia-smi topo -m" in joined
    assert "ACS" in joined and "IOMMU" in joined
    assert "NCCL_NET_GDR_READ" in joined  # only the send side lacks /GDRDMA
    assert "nvidia-peermem" not in joined


def test_mixed_devices_name_the_bad_nic():
    text = "\n".join(
        [
            P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/0/GDRDMA",
            P + "Channel 01/0 : 7[7] -> 15[7] [send] via NET/IBext_v8/3",
        ]
    )
    report = parse_nccl_log(text)
    assert "1 of 2 inter-node connections does not use GPUDirect RDMA" in report.verdict
    assert any("NET/IBext_v8/3" in a and "NCCL_IB_HCA" in a for a in report.advice)


def test_socket_verdict_and_advice():
    text = "\n".join(
        [
            P + "NET/IB : No device found.",
            P + "NCCL_IB_DISABLE set by environment to 1",
            P + "Using network Socket",
            P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
            Q + "Channel 00/0 : 0[0] -> 8[0] [receive] via NET/Socket/0",
        ]
    )
    report = parse_nccl_log(text)
    assert report.verdict == "2 of 2 inter-node connections do not use GPUDirect RDMA (2 via NET/Socket: TCP)"
    joined = " ".join(report.advice)
    assert "NCCL_IB_DISABLE=1" in joined
    assert "No device found" in joined and "Using network Socket" in joined
    assert "libibverbs" in joined
    assert "nvidia-peermem" not in joined and "NCCL_NET_GDR_LEVEL" not in joined


def test_intra_node_only():
    text = "\n".join(
        [
            P + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
            P + "Channel 00 : 1[1] -> 0[0] via SHM/direct/direct",
        ]
    )
    report = parse_nccl_log(text)
    assert report.inter_node == 0
    assert report.verdict.startswith("no inter-node connections")
    assert "P2P: 1" in report.verdict and "SHM: 1" in report.verdict


def test_no_connection_lines():
    report = parse_nccl_log(P + "NCCL version 2.20.5+cuda12.4\n" + P + "Bootstrap : Using eth0:10.0.0.1<0>\n")
    assert report.verdict.startswith("no NCCL connection lines found")
    joined = " ".join(report.advice)
    assert "NCCL_DEBUG=INFO" in joined and "NCCL_DEBUG_SUBSYS" in joined
    assert parse_nccl_log("").verdict.startswith("no NCCL connection lines found")


def test_to_dict_is_json_able():
    text = "\n".join(
        [
            P + "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
            P + "Channel 00/0 : 3[3] -> 11[3] [send] via NET/IB/0/GDRDMA",
            P + "Channel 00/0 : 3[3] -> 4[4] via SHM/direct/direct",
        ]
    )
    report = parse_nccl_log(text)
    assert isinstance(report, NcclReport)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["inter_node"] == 1 and d["inter_node_gdr"] == 1
    assert [(c["transport"], c["gdr"]) for c in d["connections"]] == [("NET", True), ("SHM", False)]
    assert d["transports"] == {"NET": 1, "SHM": 1}
    assert d["hca"][0]["name"] == "mlx5_0"
    assert d["verdict"] == report.verdict


# --- the collected real-world samples (development workspace only) ---------------------------------


def test_samples_log():
    if not SAMPLES.exists():
        pytest.skip("../shared/data/nccl-logs not present (only in the development workspace)")
    report = parse_nccl_log(SAMPLES.read_text(encoding="utf-8", errors="replace"))
    assert len(report.connections) == 10
    assert report.transport_counts() == {"NET": 6, "P2P": 3, "SHM": 1}
    net = [c for c in report.connections if c.transport == "NET"]
    assert sum(c.gdr for c in net) == 3
    assert sorted((c.net, c.gdr) for c in net) == [
        ("IB", True),
        ("IB", True),
        ("IBext_v8", False),
        ("IBext_v8", True),
        ("Socket", False),
        ("Socket", False),
    ]
    assert (report.inter_node, report.inter_node_gdr) == (6, 3)
    assert sorted(c.detail for c in report.connections if c.transport == "P2P") == [
        "P2P/CUMEM",
        "P2P/IPC/read",
        "P2P/direct pointer",
    ]
    assert [c.detail for c in report.connections if c.transport == "SHM"] == ["SHM/direct/direct"]
    assert sum(c.dev_is_bus_id for c in report.connections) == 3  # the older "rank[busId]" form
    assert [(h.hca_index, h.name, h.enabled) for h in report.hca] == [(0, "mlx5_0", False)]
    assert report.nccl_version is None
    assert report.verdict == (
        "3 of 6 inter-node connections do not use GPUDirect RDMA "
        "(1 via NET/IBext_v8 without /GDRDMA: staged through host memory; 2 via NET/Socket: TCP)"
    )
