#!/usr/bin/env python3
"""Print, for every frame of pcap/pcapng files, the RoCEv2 ICRC as two
independent implementations compute it.

Usage: roce_icrc.py FILE...

Output: for each file a line "== FILE", then one tab-separated line per
frame (1-based frame numbers):

    frame  family  scapy  masked  wire

family is "4", "6" or "-" (not a RoCEv2 frame: the other columns are "-").
scapy  is the ICRC from scapy.contrib.roce BTH.compute_icrc (IPv4 only in
       scapy 2.5, so "-" for IPv6).
masked is the ICRC from a masked pseudo-header built here from the raw bytes
       and fed to zlib.crc32 (IPv4 and IPv6).
wire   is the ICRC carried by the frame.
All three are the four ICRC bytes in wire order, as lowercase hex.

The masked computation follows the RoCEv2 rules: 8 bytes of 0xFF for the
absent LRH, then the IP header with TOS/traffic class, flow label, TTL/hop
limit and the IPv4 checksum set to all ones, the UDP header with its checksum
set to 0xFFFF, the BTH with byte 4 (FECN/BECN/resv6) set to 0xFF, then the
rest of the IB packet up to but excluding the ICRC. zlib.crc32 of that,
written little-endian, is the ICRC.
"""

import struct
import sys
import zlib

import logging

# scapy warns on stderr about things such as missing routes; keep stderr for
# real failures.
logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.all import rdpcap, raw  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402

ROCE_PORT = 4791


def split_frame(b):
    """Return (family, ip_header, udp_and_ib_with_icrc) or None."""
    if len(b) < 14:
        return None
    off = 12
    etype = struct.unpack_from("!H", b, off)[0]
    off += 2
    while etype in (0x8100, 0x88A8):
        if len(b) < off + 4:
            return None
        etype = struct.unpack_from("!H", b, off + 2)[0]
        off += 4
    if etype == 0x0800:
        if len(b) < off + 20:
            return None
        ihl = (b[off] & 0x0F) * 4
        total = struct.unpack_from("!H", b, off + 2)[0]
        if b[off] >> 4 != 4 or ihl < 20 or b[off + 9] != 17:
            return None
        if len(b) < off + total or total < ihl + 8:
            return None
        return "4", b[off:off + ihl], b[off + ihl:off + total]
    if etype == 0x86DD:
        if len(b) < off + 40:
            return None
        plen = struct.unpack_from("!H", b, off + 4)[0]
        if b[off] >> 4 != 6 or b[off + 6] != 17:
            return None
        if len(b) < off + 40 + plen:
            return None
        return "6", b[off:off + 40], b[off + 40:off + 40 + plen]
    return None


def masked_icrc(family, ip, udp):
    ip = bytearray(ip)
    if family == "4":
        ip[1] = 0xFF  # TOS
        ip[8] = 0xFF  # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        ip[0] |= 0x0F  # traffic class (high nibble) ...
        ip[1:4] = b"\xff\xff\xff"  # ... traffic class (low nibble), flow label
        ip[7] = 0xFF  # hop limit
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"  # UDP checksum
    udp[8 + 4] = 0xFF  # BTH byte 4
    data = b"\xff" * 8 + bytes(ip) + bytes(udp[:-4])
    return struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF).hex()


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: roce_icrc.py FILE...\n")
        return 2
    for path in argv[1:]:
        print("==", path)
        dump(path)
    return 0


def dump(path):
    for n, pkt in enumerate(rdpcap(path), start=1):
        b = raw(pkt)
        parts = split_frame(b)
        if parts is None:
            print(n, "-", "-", "-", "-", sep="\t")
            continue
        family, ip, udp = parts
        if len(udp) < 8 + 12 + 4:
            print(n, "-", "-", "-", "-", sep="\t")
            continue
        sport, dport, ulen = struct.unpack_from("!HHH", udp, 0)
        if dport != ROCE_PORT or ulen < 8 + 12 + 4 or ulen > len(udp):
            print(n, "-", "-", "-", "-", sep="\t")
            continue
        udp = udp[:ulen]
        scapy_icrc = "-"
        if family == "4" and pkt.haslayer(IP) and pkt.haslayer(BTH):
            scapy_icrc = pkt[BTH].compute_icrc(None).hex()
        print(n, family, scapy_icrc, masked_icrc(family, ip, udp),
              udp[-4:].hex(), sep="\t")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
