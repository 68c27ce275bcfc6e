#!/usr/bin/env python3
"""A second, table-driven RoCEv2 header decoder, written from the opcode and
header layout tables of the IBA / rxe documentation rather than from package
ib. It covers the opcodes Wireshark 4.0 cannot check (RD, XRC, CNP, FLUSH,
ATOMIC_WRITE) as well as the rest.

Usage:
    roce_layout.py --opcodes      print the defined opcodes, one number per line
    roce_layout.py FILE...        for each file a line "== FILE", then one JSON
                                  object per RoCEv2 frame (frames that are not
                                  RoCEv2 are skipped)

Keys follow "rocectl pcap --json": frame, opcode, pad, dest_qp, psn, rdeth,
deth, xrceth, feth, reth, atomic, aeth, atomic_ack, imm, ieth, payload_len.
"""

import json
import logging
import struct
import sys

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

# Operation (low five opcode bits) -> (name, own headers in wire order,
# carries payload, is a response). IBA vol 1 table 38 / linux rxe_opcode.c.
OPS = {
    0x00: ("SEND_FIRST", [], True, False),
    0x01: ("SEND_MIDDLE", [], True, False),
    0x02: ("SEND_LAST", [], True, False),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", ["imm"], True, False),
    0x04: ("SEND_ONLY", [], True, False),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", ["imm"], True, False),
    0x06: ("RDMA_WRITE_FIRST", ["reth"], True, False),
    0x07: ("RDMA_WRITE_MIDDLE", [], True, False),
    0x08: ("RDMA_WRITE_LAST", [], True, False),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", ["imm"], True, False),
    0x0A: ("RDMA_WRITE_ONLY", ["reth"], True, False),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", ["reth", "imm"], True, False),
    0x0C: ("RDMA_READ_REQUEST", ["reth"], False, False),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", ["aeth"], True, True),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", [], True, True),
    0x0F: ("RDMA_READ_RESPONSE_LAST", ["aeth"], True, True),
    0x10: ("RDMA_READ_RESPONSE_ONLY", ["aeth"], True, True),
    0x11: ("ACKNOWLEDGE", ["aeth"], False, True),
    0x12: ("ATOMIC_ACKNOWLEDGE", ["aeth", "atomic_ack"], False, True),
    0x13: ("COMPARE_SWAP", ["atomic"], False, False),
    0x14: ("FETCH_ADD", ["atomic"], False, False),
    0x16: ("SEND_LAST_WITH_INVALIDATE", ["ieth"], True, False),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", ["ieth"], True, False),
    0x1C: ("FLUSH", ["feth", "reth"], False, False),
    0x1D: ("ATOMIC_WRITE", ["reth"], True, False),
}

SEND_WRITE = list(range(0x00, 0x0C))
READ_ATOMIC = list(range(0x0C, 0x15))
INV = [0x16, 0x17]

# Transport (top three opcode bits) -> defined operations.
TRANSPORTS = {
    0x00: SEND_WRITE + READ_ATOMIC + INV + [0x1C, 0x1D],  # RC
    0x20: SEND_WRITE,                                     # UC
    0x40: SEND_WRITE + READ_ATOMIC + [0x1C],              # RD
    0x60: [0x04, 0x05],                                   # UD
    0xA0: SEND_WRITE + READ_ATOMIC + INV,                 # XRC
}
CNP = 0x81

SIZES = {"rdeth": 4, "deth": 8, "xrceth": 4, "feth": 4, "reth": 16,
         "atomic": 28, "aeth": 4, "atomic_ack": 8, "imm": 4, "ieth": 4,
         "cnp": 16}


def layout(opcode):
    """Headers after the BTH in wire order, and whether a payload follows;
    None for an undefined opcode."""
    if opcode == CNP:
        return ["cnp"], False
    tr, op = opcode & 0xE0, opcode & 0x1F
    if tr not in TRANSPORTS or op not in TRANSPORTS[tr]:
        return None
    _, own, payload, response = OPS[op]
    pre = []
    if tr == 0x40:  # RD: RDETH, then DETH in requests
        pre = ["rdeth"] if response else ["rdeth", "deth"]
    elif tr == 0x60:  # UD
        pre = ["deth"]
    elif tr == 0xA0 and not response:  # XRC requests
        pre = ["xrceth"]
    return pre + own, payload


def u24(b):
    return int.from_bytes(b[:3], "big")


def decode_header(name, b):
    if name == "rdeth":
        return {"eec": u24(b[1:4])}
    if name == "deth":
        return {"qkey": struct.unpack("!I", b[0:4])[0], "src_qp": u24(b[5:8])}
    if name == "xrceth":
        return {"srqn": u24(b[1:4])}
    if name == "feth":
        w = b[3]  # placement bits 3-0, selectivity bits 5-4 of the word
        return {"placement": w & 0x0F, "selectivity": (w >> 4) & 0x03}
    if name == "reth":
        va, rkey, dlen = struct.unpack("!QII", b[:16])
        return {"va": va, "rkey": rkey, "dma_len": dlen}
    if name == "atomic":
        va, rkey, swap, cmp = struct.unpack("!QIQQ", b[:28])
        return {"va": va, "rkey": rkey, "swap_add": swap, "compare": cmp}
    if name == "aeth":
        return {"syndrome": b[0], "msn": u24(b[1:4])}
    if name == "atomic_ack":
        return {"orig": struct.unpack("!Q", b[:8])[0]}
    if name in ("imm", "ieth"):
        return struct.unpack("!I", b[:4])[0]
    return None


def ib_part(b):
    """The UDP payload (BTH .. ICRC) of a RoCEv2 frame, or None."""
    if len(b) < 14:
        return None
    off, etype = 14, struct.unpack_from("!H", b, 12)[0]
    while etype in (0x8100, 0x88A8) and len(b) >= off + 4:
        etype = struct.unpack_from("!H", b, off + 2)[0]
        off += 4
    if etype == 0x0800 and len(b) >= off + 20 and b[off + 9] == 17:
        off += (b[off] & 0x0F) * 4
    elif etype == 0x86DD and len(b) >= off + 40 and b[off + 6] == 17:
        off += 40
    else:
        return None
    if len(b) < off + 8:
        return None
    dport, ulen = struct.unpack_from("!HH", b, off + 2)
    if dport != 4791 or ulen < 8 or len(b) < off + ulen:
        return None
    return b[off + 8:off + ulen]


def decode(n, ibp):
    out = {"frame": n}
    if len(ibp) < 12 + 4:
        out["error"] = "short"
        return out
    opcode = ibp[0]
    out["opcode"] = opcode
    out["pad"] = (ibp[1] >> 4) & 3
    out["dest_qp"] = u24(ibp[5:8])
    out["psn"] = u24(ibp[9:12])
    lay = layout(opcode)
    if lay is None:
        out["error"] = "undefined opcode"
        return out
    headers, payload = lay
    off = 12
    for h in headers:
        if len(ibp) < off + SIZES[h] + 4:
            out["error"] = "short"
            return out
        v = decode_header(h, ibp[off:off + SIZES[h]])
        if v is not None:
            out[h] = v
        off += SIZES[h]
    rest = len(ibp) - off - 4 - out["pad"]
    if rest < 0 or (rest > 0 and not payload):
        out["error"] = "bad length"
        return out
    out["payload_len"] = rest
    return out


def main(argv):
    if argv[1:] == ["--opcodes"]:
        for o in range(256):
            if layout(o) is not None:
                print(o)
        return 0
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    from scapy.all import rdpcap, raw
    for path in argv[1:]:
        print("==", path)
        for n, pkt in enumerate(rdpcap(path), start=1):
            ibp = ib_part(raw(pkt))
            if ibp is not None:
                print(json.dumps(decode(n, ibp)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
