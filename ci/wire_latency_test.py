#!/usr/bin/env python3
"""ci/wire_latency.py's reading of a capture, on packets built here (no tcpdump, no root):
two connections, a request split over two packets, bare acks between, an answer whose status
is read from its first packet, a second request on a kept-alive connection, and the server's
own later packets (a stream's chunks) that answer nothing. Run by ci/test.sh."""
import struct
import sys

from wire_latency import answers, read_pcap

PORT = 8080


def packet(t, sport, dport, payload=b""):
    tcp = struct.pack(">HHIIBBHHH", sport, dport, 1, 1, 5 << 4, 0x18, 512, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), 0, 0, 64, 6, 0,
                     bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
    frame = b"\x00" * 12 + b"\x08\x00" + ip + tcp + payload
    sec, usec = int(t), round((t - int(t)) * 1e6)
    return struct.pack("<IIII", sec, usec, len(frame), len(frame)) + frame


def capture(packets):
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    return head + b"".join(packets)


def main():
    pcap = capture([
        packet(100.000, 40001, PORT, b"POST /v1/chat/completions HTTP/1.1\r\n"),
        packet(100.002, 40001, PORT, b'{"model":"m"}'),          # the body: the request's end
        packet(100.003, PORT, 40001),                               # an ack, no data
        packet(100.010, 40002, PORT, b"POST /v1/chat/completions HTTP/1.1\r\n"),
        packet(100.0045, PORT, 40001, b"HTTP/1.1 429 Too Many Requests\r\n"),
        packet(100.500, PORT, 40002, b"HTTP/1.1 200 OK\r\n"),
        packet(100.600, PORT, 40002, b"data: {}\n\n"),             # a chunk: no answer
        packet(101.000, 40001, PORT, b"POST /v1/chat/completions HTTP/1.1\r\n"),
        packet(101.001, PORT, 40001, b"HTTP/1.1 503 Service Unavailable\r\n"),
    ])
    got = [(status, round(ms, 1)) for status, ms in answers(read_pcap(pcap), PORT)]
    want = [(429, 2.5), (200, 490.0), (503, 1.0)]
    if got != want:
        print(f"wire_latency: read {got}, want {want}", file=sys.stderr)
        return 1
    # a capture cut short, or of a link it cannot read, gives nothing rather than failing
    if read_pcap(pcap[:10]) != [] or read_pcap(pcap[:20] + b"\x00\x00\x00\x09" + pcap[24:]) != []:
        print("wire_latency: read a capture it cannot", file=sys.stderr)
        return 1
    print("wire_latency: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
