"""Which transport each NCCL connection uses, and whether it uses GPUDirect RDMA.

Reads the text of an ``NCCL_DEBUG=INFO`` log (no I/O here: the caller reads the file) and returns
one :class:`Connection` per connection line, the per-HCA ``GPU Direct RDMA Enabled|Disabled``
capability lines, a verdict and advice that refers to what the log shows.

The connection lines follow NCCL's own format strings (src/transport/net.cc, p2p.cc, shm.cc,
coll_net.cc; src/graph/topo.cc for the HCA line)::

    Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s     suffixes /GDRDMA, (PCI), /Shared
    Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)%s%s%s  PXN: sent through a proxy rank
    Channel %02d/%d : %d[%d] -> %d[%d] [receive] via NET/%s/%d%s%s%s
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/direct pointer%s     %s: /read
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/%s%s%s               CUMEM or MNNVL, /read, /CE
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/IPC%s%s
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/indirect/%d[%d]%s
    Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s                      older: SHM/direct/direct
    CollNet %02d/%1d : %d [send] via COLLNET/%s/%d%s%s                older: "Coll %02d : %d ..."
    Ring %02d : %d -> %d [receive] via NET/%s/%d%s                    very old releases
    NET/%s : GPU Direct RDMA %s for HCA %d '%s'

Older releases print the PCI bus id in hex inside the brackets (``2[c7000]``) where newer ones print
the device index (``2[7]``); :attr:`Connection.dev_is_bus_id` tells which was read.

A connection uses GPUDirect RDMA exactly when its ``via NET/...`` (or ``via COLLNET/...``) token
carries ``/GDRDMA``. ``NET/IB`` (or any RDMA plugin: ``IBext_v8``, ``AWS Libfabric``, ``OFI``...)
without it stages every message through host memory; ``NET/Socket`` is TCP. P2P and SHM connections
stay inside a node, so GPUDirect RDMA does not apply to them (``P2P/MNNVL`` crosses nodes over the
multi-node NVLink fabric, not through a NIC, and is counted as intra-node here for the same reason).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Connection", "HcaGdr", "NcclReport", "parse_nccl_log"]

INTER_NODE_TRANSPORTS = frozenset({"NET", "COLLNET"})


@dataclass(frozen=True)
class Connection:
    """One connection line of the log (lines are not deduplicated: each side logs its own)."""

    channel: int | None
    src_rank: int
    src_dev: int | None
    dst_rank: int | None  # None for CollNet lines: the peer is the collective network itself
    dst_dev: int | None
    direction: str  # "send", "receive", or "" (P2P/SHM lines carry none)
    transport: str  # "NET", "P2P", "SHM", "COLLNET", or whatever else follows "via" (e.g. "NVLS")
    net: str | None  # network plugin name for NET/COLLNET: "IB", "IBext_v8", "Socket", "AWS Libfabric"
    device: int | None  # network device index (NET/COLLNET)
    proxy_rank: int | None  # PXN proxy rank for NET/%s/%d(%d); intermediate rank for P2P/indirect
    gdr: bool
    detail: str  # the transport token, e.g. "NET/IB/0/GDRDMA", "P2P/CUMEM/read", "SHM/direct/direct"
    inter_node: bool
    line_no: int  # 1-based
    host: str | None  # host of the process that printed the line, when the prefix names it
    conn_index: int | None = None  # the "/%d" after the channel number (0: collectives, 1: p2p ops)
    dev_is_bus_id: bool = False  # the bracketed values were PCI bus ids (older releases), not indices


@dataclass(frozen=True)
class HcaGdr:
    """A ``NET/<plugin> : GPU Direct RDMA Enabled|Disabled for HCA <n> '<name>'`` line."""

    hca_index: int
    name: str
    enabled: bool
    host: str | None
    net: str | None = None
    qualifier: str | None = None  # "(DMABUF)" style qualifier or trailing "(no module)" reason
    line_no: int = 0


@dataclass(frozen=True)
class NcclReport:
    connections: list[Connection]
    hca: list[HcaGdr]
    nccl_version: str | None
    inter_node: int
    inter_node_gdr: int
    verdict: str
    advice: list[str]
    env: dict[str, str] = field(default_factory=dict)  # "NCCL_X set by environment to Y" lines
    nccl_versions: list[str] = field(default_factory=list)  # every distinct version, in order seen
    skipped_lines: list[int] = field(default_factory=list)  # connection lines cut short: not counted

    @property
    def inter_node_non_gdr(self) -> int:
        return self.inter_node - self.inter_node_gdr

    def transport_counts(self) -> dict[str, int]:
        return dict(Counter(c.transport for c in self.connections))

    def to_dict(self) -> dict[str, Any]:
        return {
            "nccl_version": self.nccl_version,
            "nccl_versions": list(self.nccl_versions),
            "inter_node": self.inter_node,
            "inter_node_gdr": self.inter_node_gdr,
            "inter_node_non_gdr": self.inter_node_non_gdr,
            "transports": self.transport_counts(),
            "verdict": self.verdict,
            "advice": list(self.advice),
            "env": dict(self.env),
            "hca": [asdict(h) for h in self.hca],
            "connections": [asdict(c) for c in self.connections],
            "skipped_lines": list(self.skipped_lines),
        }


# --- line patterns ---------------------------------------------------------------------------

# "host:pid:tid [dev] NCCL INFO ...", possibly behind "[0] ", a timestamp, or "[1,0]<stdout>:".
_PREFIX_RE = re.compile(r"(?:^|(?<=[\s:\]>]))(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[\d+\]")

_CHANNEL_RE = re.compile(
    r"\b(?:Channel|Ring)\s+(?P<channel>\d+)(?:/(?P<conn_index>\d+))?\s*:\s*"
    r"(?P<src>\d+)(?:\s*\[(?P<src_dev>[0-9a-fA-F]+)\])?\s*->\s*"
    r"(?P<dst>\d+)(?:\s*\[(?P<dst_dev>[0-9a-fA-F]+)\])?\s*"
    r"(?:\[(?P<direction>send|receive|recv)\]\s*)?"
    r"via\s+(?P<via>\S.*)$"
)

_COLLNET_RE = re.compile(
    r"\b(?:CollNet|Coll)\s+(?P<channel>\d+)(?:/(?P<conn_index>\d+))?\s*:\s*(?P<rank>\d+)\s*"
    r"(?:\[(?P<direction>send|receive|recv)\]\s*)?"
    r"via\s+(?P<via>\S.*)$"
)

# NET/<plugin>/<dev>[(<proxy>)]<flags>: the plugin name may hold spaces ("AWS Libfabric") but no "/".
_NET_VIA_RE = re.compile(
    r"^(?P<kind>NET|COLLNET)/(?P<net>[^/]+?)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<flags>[^\s]*)",
    re.IGNORECASE,
)
_P2P_VIA_RE = re.compile(
    r"^P2P/(?:direct pointer|indirect/(?P<inter>\d+)(?:\[[0-9a-fA-F]+\])?|[A-Za-z0-9_]+)[^\s]*",
    re.IGNORECASE,
)
_SHM_VIA_RE = re.compile(r"^(?:SHM(?:/[^\s]*)?|direct shared memory)", re.IGNORECASE)
_OTHER_VIA_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)(?P<rest>/[^\s]*)?")

_HCA_RE = re.compile(
    r"\bNET/(?P<net>[^:\n]{1,64}?)\s*:\s*GPU Direct RDMA\s*(?P<qual>\([^)]*\))?\s*(?P<state>enabled|disabled)\s+"
    r"for HCA\s+(?P<idx>\d+)\s+'(?P<name>[^']*)'\s*(?P<reason>\([^)]*\))?",
    re.IGNORECASE,
)
_VERSION_RE = re.compile(r"\bNCCL version\s+(?P<version>\d+\.\d+\.\d+[^\s,;]*)")
_ENV_RE = re.compile(r"\b(?P<var>NCCL_[A-Z0-9_]+) set by environment to\s*(?P<value>.*?)\s*$")
_IB_NO_DEVICE_RE = re.compile(r"\bNET/IB\s*:\s*No device found", re.IGNORECASE)
_USING_NETWORK_RE = re.compile(r"\bUsing network\s+(?P<net>\S.*?)\s*$")
# searched only after the first "NET/Plugin" (one ".*" per occurrence made long junk lines quadratic)
_PLUGIN_RE = re.compile(r"\bNET/Plugin\b", re.IGNORECASE)
_PLUGIN_FAIL_WORDS_RE = re.compile(r"\b(?:No plugin found|Failed|could not find|not found)", re.IGNORECASE)


def _plugin_failed(line: str) -> bool:
    m = _PLUGIN_RE.search(line)
    return m is not None and _PLUGIN_FAIL_WORDS_RE.search(line, m.end()) is not None


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _dev(text: str | None) -> tuple[int | None, bool]:
    """Bracketed device: a decimal index (newer NCCL) or a hex PCI bus id such as "1b000" (older)."""
    if not text:
        return None, False
    if text.isdigit() and len(text) <= 3:
        return _int(text), False
    return _int(text, 16), True


def _host(line: str, end: int) -> str | None:
    matches = list(_PREFIX_RE.finditer(line, 0, end))
    return matches[-1].group("host") if matches else None


@dataclass(frozen=True)
class _Via:
    transport: str
    net: str | None = None
    device: int | None = None
    proxy_rank: int | None = None
    gdr: bool = False
    detail: str = ""


class _Malformed(ValueError):
    """A connection line cut off (or garbled) before its transport token is complete."""


_NET_PREFIX_RE = re.compile(r"^(?:NET|COLLNET)(?:/|$)", re.IGNORECASE)
# the start of a connection line: "Channel 00/0 : 3[3] -> " (or "Ring 00 : 43 -> ")
_CHANNEL_HEAD_RE = re.compile(r"\b(?:Channel|Ring)\s+\d+(?:/\d+)?\s*:\s*\d+(?:\s*\[[0-9a-fA-F]*\]?)?\s*->")


def _parse_via(via: str) -> _Via:
    via = via.strip()
    m = _NET_VIA_RE.match(via)
    if not m and _NET_PREFIX_RE.match(via):
        # "via NET/IB" or "via NET/": no device index, so the line was cut off; whether "/GDRDMA" followed
        # is unknown, and counting it as a staged connection would be a false alarm
        raise _Malformed(via)
    if m:
        kind = m.group("kind").upper()
        flags = m.group("flags")
        return _Via(
            transport=kind,
            net=m.group("net").strip(),
            device=_int(m.group("dev")),
            proxy_rank=_int(m.group("proxy")),
            gdr="/GDRDMA" in flags.upper(),
            detail=m.group(0),
        )
    m = _P2P_VIA_RE.match(via)
    if m:
        return _Via(transport="P2P", proxy_rank=_int(m.group("inter")), detail=m.group(0))
    m = _SHM_VIA_RE.match(via)
    if m:
        return _Via(transport="SHM", detail=m.group(0))
    m = _OTHER_VIA_RE.match(via)
    if m:
        return _Via(transport=m.group("name").upper(), detail=m.group(0))
    token = via.split()[0] if via.split() else via
    return _Via(transport=token.upper() or "UNKNOWN", detail=token)


def _from_match(
    m: re.Match, line: str, line_no: int, src: int, src_dev: int | None, dst: int | None, dst_dev: int | None, bus: bool
) -> Connection:
    """One Connection from a matched channel (or CollNet) line: the parts the two forms share."""
    via = _parse_via(m.group("via"))
    direction = m.group("direction") or ""
    return Connection(
        channel=_int(m.group("channel")),
        src_rank=src,
        src_dev=src_dev,
        dst_rank=dst,
        dst_dev=dst_dev,
        direction="receive" if direction == "recv" else direction,
        transport=via.transport,
        net=via.net,
        device=via.device,
        proxy_rank=via.proxy_rank,
        gdr=via.gdr,
        detail=via.detail,
        inter_node=via.transport in INTER_NODE_TRANSPORTS,
        line_no=line_no,
        host=_host(line, m.start()),
        conn_index=_int(m.group("conn_index")),
        dev_is_bus_id=bus,
    )


def _connection(line: str, line_no: int) -> Connection | None:
    """The line's connection; None if it is not a connection line; _Malformed if it is one cut short."""
    m = _CHANNEL_RE.search(line)
    if not m and _CHANNEL_HEAD_RE.search(line):
        raise _Malformed(line)
    if m:
        src_dev, bus1 = _dev(m.group("src_dev"))
        dst_dev, bus2 = _dev(m.group("dst_dev"))
        src, dst = _int(m.group("src")), _int(m.group("dst"))
        if src is None or dst is None:
            return None
        return _from_match(m, line, line_no, src, src_dev, dst, dst_dev, bus1 or bus2)
    m = _COLLNET_RE.search(line)
    if m:
        rank = _int(m.group("rank"))
        if rank is None:
            return None
        return _from_match(m, line, line_no, rank, None, None, None, False)
    return None


def _hca(line: str, line_no: int) -> HcaGdr | None:
    m = _HCA_RE.search(line)
    if not m:
        return None
    idx = _int(m.group("idx"))
    if idx is None:
        return None
    qual = " ".join(q for q in (m.group("qual"), m.group("reason")) if q) or None
    return HcaGdr(
        hca_index=idx,
        name=m.group("name"),
        enabled=m.group("state").lower() == "enabled",
        host=_host(line, m.start()),
        net=m.group("net").strip(),
        qualifier=qual,
        line_no=line_no,
    )


# --- verdict and advice ----------------------------------------------------------------------


def _is_socket(net: str | None) -> bool:
    return (net or "").lower().startswith("socket")


def _hosts(items: list[Any]) -> str:
    hosts = sorted({i.host for i in items if i.host})
    if not hosts:
        return ""
    shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return f" (on {shown})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _no_connections(hca: list[HcaGdr], versions: list[str]) -> tuple[str, list[str]]:
    verdict = "no NCCL connection lines found (no 'Channel/Ring ... via ...' lines)"
    advice = [
        "Run with NCCL_DEBUG=INFO; the connection lines are logged under the INIT subsystem (NET, P2P and SHM "
        "as well), so if NCCL_DEBUG_SUBSYS is set it must include INIT or NET (e.g. NCCL_DEBUG_SUBSYS=INIT,NET).",
        "NCCL connects lazily: recent releases (NCCL_RUNTIME_CONNECT, default on since 2.22) connect at the first "
        "collective that needs a path, so the log must cover the first collective, not just communicator init.",
        "Collect the log of every rank (e.g. NCCL_DEBUG_FILE=/some/dir/nccl.%h.%p.log): each process prints only "
        "its own connections.",
    ]
    if hca:
        disabled = [h for h in hca if not h.enabled]
        if disabled:
            advice.append(
                f"The log does show {_plural(len(disabled), 'HCA')} with GPU Direct RDMA Disabled"
                f"{_hosts(disabled)}: inter-node traffic through them will be staged through host memory."
            )
    if not versions:
        advice.append("No 'NCCL version' line either: check that this is the output of an NCCL_DEBUG=INFO run.")
    return verdict, advice


def _advice(conns: list[Connection], hca: list[HcaGdr], env: dict[str, str], notes: dict[str, list[str]]) -> list[str]:
    advice: list[str] = []
    inter = [c for c in conns if c.inter_node]
    non_gdr = [c for c in inter if not c.gdr]
    socket = [c for c in non_gdr if _is_socket(c.net)]
    staged = [c for c in non_gdr if not _is_socket(c.net)]
    disabled = [h for h in hca if not h.enabled]

    if staged:
        nets = sorted({c.net or "?" for c in staged})
        devs = sorted({c.device for c in staged if c.device is not None})
        # HCA index n in "for HCA n" is the plugin's device n, as in "via NET/<plugin>/n"; only HCA lines of
        # the hosts that printed these connections count (or all of them when the prefixes name no host).
        staged_hosts = {c.host for c in staged}
        relevant = [h for h in hca if h.host is None or None in staged_hosts or h.host in staged_hosts]
        matching = [h for h in relevant if h.hca_index in devs]
        disabled_used = [h for h in (matching or relevant) if not h.enabled]
        elsewhere = [h for h in disabled if h not in relevant]
        if disabled_used:
            names = ", ".join(
                sorted(
                    {
                        f"HCA {h.hca_index} '{h.name}'" + (f" {h.qualifier}" if h.qualifier else "")
                        for h in disabled_used
                    }
                )
            )
            advice.append(
                f"NCCL reports 'GPU Direct RDMA Disabled' for {names}{_hosts(disabled_used)}: the NIC driver cannot "
                "register GPU memory. Load the peer-memory kernel module on every node (`lsmod | grep -E "
                "'nvidia_peermem|nv_peer_mem'`; `modprobe nvidia-peermem`, or nv_peer_mem with older MLNX_OFED), "
                "or use DMA-BUF (Linux >= 5.12 with a GPU driver and NCCL that support it; NCCL_DMABUF_ENABLE)."
            )
        else:
            if relevant:
                head = "The HCA lines say GPU Direct RDMA is Enabled, so NCCL chose host staging from the topology: "
            else:
                where = " for these hosts" if hca else ""
                head = (
                    f"The log has no 'GPU Direct RDMA Enabled|Disabled for HCA' lines{where} (they are logged under "
                    "NCCL_DEBUG_SUBSYS=NET); first make sure nvidia-peermem (or nv_peer_mem) is loaded. "
                    "If it is, NCCL chose host staging from the topology: "
                )
            advice.append(
                head + "it uses GPUDirect RDMA only when the GPU-NIC PCIe distance is within NCCL_NET_GDR_LEVEL "
                "(LOC, PIX, PXB, PHB, SYS; legacy integers 0-5; by default usually PXB, i.e. behind the same PCIe "
                "switch). Check the GPU-to-NIC entries of `nvidia-smi topo -m`: PHB, NODE or SYS mean the path "
                "crosses a CPU host bridge or socket. Pair each GPU with its nearest NIC (NCCL_IB_HCA), or raise "
                "NCCL_NET_GDR_LEVEL (e.g. PHB or SYS) to force GPUDirect RDMA over the longer path."
            )
            advice.append(
                "Before forcing GPUDirect RDMA across PCIe switches, check that ACS is disabled on the switches "
                "(`lspci -vvv | grep ACSCtl`) and the IOMMU is off or in passthrough (iommu=pt): otherwise "
                "peer-to-peer PCIe traffic is redirected through the root complex (slow, or hangs)."
            )
        level = env.get("NCCL_NET_GDR_LEVEL")
        if level is not None:
            advice.append(
                f"NCCL_NET_GDR_LEVEL is set by the environment to {level!r}: "
                + (
                    "that disables GPUDirect RDMA outright (LOC / 0); unset it or raise it."
                    if level.strip().upper() in {"LOC", "0"}
                    else "check it against the GPU-NIC distance above."
                )
            )
        send_only = {c.direction for c in staged} == {"send"}
        if send_only and any(c.gdr and c.direction == "receive" for c in inter):
            advice.append(
                "Only the [send] side lacks /GDRDMA while [receive] has it: GPUDirect RDMA reads (NIC reading GPU "
                "memory when sending) are off; set NCCL_NET_GDR_READ=1 (default on NVLink-based platforms only)."
            )
        if elsewhere:
            advice.append(
                f"The log also shows 'GPU Direct RDMA Disabled' for {_plural(len(elsewhere), 'HCA')}"
                f"{_hosts(elsewhere)}, not among the hosts of the staged connections above: any inter-node traffic "
                "through those NICs will be staged too; check nvidia-peermem (or nv_peer_mem) there."
            )
        gdr_devs = sorted({(c.net, c.device) for c in inter if c.gdr and c.device is not None and c.net in nets})
        bad_devs = sorted({(c.net, c.device) for c in staged if c.device is not None})
        if gdr_devs and bad_devs:
            fmt = ", ".join(f"NET/{n}/{d}" for n, d in bad_devs)
            good = ", ".join(f"NET/{n}/{d}" for n, d in gdr_devs)
            advice.append(
                f"GPUDirect RDMA is used on {good} but not on {fmt}{_hosts(staged)}: the GPUs using the latter are "
                "farther from (or on another socket than) their NIC, or that NIC lacks GDR support; compare their "
                "rows in `nvidia-smi topo -m`, and restrict NICs with NCCL_IB_HCA if some are badly placed."
            )
        elif "NCCL_IB_HCA" in env:
            advice.append(
                f"NCCL_IB_HCA is set to {env['NCCL_IB_HCA']!r}: check that it selects the NICs closest to the GPUs."
            )
        other = [n for n in nets if not n.upper().startswith("IB")]
        if other:
            advice.append(
                f"NET/{', NET/'.join(other)} is a vendor plugin: GPUDirect RDMA also needs that plugin's GDR support "
                "(e.g. for EFA: aws-ofi-nccl with FI_EFA_USE_DEVICE_RDMA=1 on instances that support it)."
            )

    if socket:
        found = []
        if notes["ib_no_device"]:
            found.append("'NET/IB : No device found'")
        if notes["plugin_fail"]:
            found.append("a failed NET/Plugin load")
        using = sorted(set(notes["using_network"]))
        if using:
            found.append("'Using network " + "', 'Using network ".join(using) + "'")
        shown = f" The log shows {', '.join(found)}." if found else ""
        verb = "goes" if len(socket) == 1 else "go"
        advice.append(
            f"{_plural(len(socket), 'inter-node connection')} {verb} over NET/Socket{_hosts(socket)}: TCP through "
            "the kernel, no RDMA at all; the IB/RoCE transport or the vendor net plugin was not used." + shown
        )
        checks = []
        if env.get("NCCL_IB_DISABLE", "").strip() == "1":
            checks.append("NCCL_IB_DISABLE=1 is set by the environment: unset it")
        if "NCCL_NET" in env:
            checks.append(f"NCCL_NET is set to {env['NCCL_NET']!r}: it must name the RDMA transport (e.g. IB)")
        if not checks:
            checks.append("that NCCL_IB_DISABLE is not 1 and NCCL_NET does not force Socket")
        checks += [
            "libibverbs/rdma-core is installed and /dev/infiniband is visible inside the container",
            "`ibv_devinfo` lists the HCAs with an active port",
            "for an external plugin (IBext, aws-ofi-nccl), that its libnccl-net*.so is on LD_LIBRARY_PATH or named "
            "by NCCL_NET_PLUGIN",
        ]
        advice.append("Check: " + "; ".join(checks) + ".")

    if not non_gdr and disabled:
        advice.append(
            f"All inter-node connections use GPUDirect RDMA, but {_plural(len(disabled), 'HCA')} report GPU Direct "
            f"RDMA Disabled{_hosts(disabled)}: harmless while unused, but a rank routed through them would be staged."
        )
    mnnvl = [c for c in conns if c.detail.upper().startswith("P2P/MNNVL")]
    if mnnvl:
        advice.append(
            f"{_plural(len(mnnvl), 'P2P/MNNVL connection')} cross nodes over the multi-node NVLink fabric: "
            "GPUDirect RDMA does not apply to them and they are not counted as inter-node here."
        )
    return advice


def _verdict(conns: list[Connection]) -> str:
    inter = [c for c in conns if c.inter_node]
    if not inter:
        counts = Counter(c.transport for c in conns)
        parts = ", ".join(f"{t}: {n}" for t, n in sorted(counts.items()))
        return (
            f"no inter-node connections: all {_plural(len(conns), 'connection')} are intra-node ({parts}); "
            "GPUDirect RDMA does not apply"
        )
    non_gdr = [c for c in inter if not c.gdr]
    n = len(inter)
    if not non_gdr:
        return (
            f"all {n} inter-node connections use GPUDirect RDMA"
            if n > 1
            else "the inter-node connection uses GPUDirect RDMA"
        )
    groups = Counter((c.transport, c.net or "?") for c in non_gdr)
    parts = []
    for (transport, net), k in sorted(groups.items()):
        if _is_socket(net):
            parts.append(f"{k} via {transport}/{net}: TCP")
        else:
            parts.append(f"{k} via {transport}/{net} without /GDRDMA: staged through host memory")
    what = "do not use" if len(non_gdr) > 1 else "does not use"
    return f"{len(non_gdr)} of {n} inter-node connections {what} GPUDirect RDMA ({'; '.join(parts)})"


# --- entry point -----------------------------------------------------------------------------


def parse_nccl_log(text: str) -> NcclReport:
    """Parse NCCL_DEBUG=INFO output; unrelated or malformed lines are ignored, never raised on."""
    conns: list[Connection] = []
    hca: list[HcaGdr] = []
    versions: list[str] = []
    env: dict[str, str] = {}
    notes: dict[str, list[str]] = {"ib_no_device": [], "plugin_fail": [], "using_network": []}
    skipped: list[int] = []

    for line_no, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.rstrip()
        if not line or ("via" not in line and "NCCL" not in line and "NET/" not in line):
            continue
        try:
            if "via" in line or "->" in line:
                try:
                    conn = _connection(line, line_no)
                except _Malformed:
                    skipped.append(line_no)
                    continue
                if conn is not None:
                    conns.append(conn)
                    continue
            h = _hca(line, line_no)
            if h is not None:
                hca.append(h)
                continue
            m = _VERSION_RE.search(line)
            if m:
                if m.group("version") not in versions:
                    versions.append(m.group("version"))
                continue
            m = _ENV_RE.search(line)
            if m:
                env[m.group("var")] = m.group("value")
                continue
            if _IB_NO_DEVICE_RE.search(line):
                notes["ib_no_device"].append(line)
            elif _plugin_failed(line):
                notes["plugin_fail"].append(line)
            else:
                m = _USING_NETWORK_RE.search(line)
                if m:
                    notes["using_network"].append(m.group("net"))
        except Exception:  # a diagnostic must not die on one odd line
            continue

    inter = [c for c in conns if c.inter_node]
    inter_gdr = sum(1 for c in inter if c.gdr)
    if not conns:
        verdict, advice = _no_connections(hca, versions)
    else:
        verdict = _verdict(conns)
        advice = _advice(conns, hca, env, notes)
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        advice.append(
            f"{_plural(len(skipped), 'connection line')} {'was' if len(skipped) == 1 else 'were'} truncated or "
            f"malformed (line {shown}) and not counted: whether they used GPUDirect RDMA cannot be told; "
            "collect the log again without line-length limits (e.g. NCCL_DEBUG_FILE rather than a clipped console)."
        )
    if len(versions) > 1:
        advice.append(
            f"Several NCCL versions appear in the log ({', '.join(versions)}): every rank should load the same one."
        )
    return NcclReport(
        connections=conns,
        hca=hca,
        nccl_version=versions[0] if versions else None,
        inter_node=len(inter),
        inter_node_gdr=inter_gdr,
        verdict=verdict,
        advice=advice,
        env=env,
        nccl_versions=versions,
        skipped_lines=skipped,
    )
