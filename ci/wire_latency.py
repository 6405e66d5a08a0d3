"""The latency of HTTP answers at the client's socket, read from a packet capture of the
loopback interface (`tcpdump`, root): from the last packet of a request to the first packet of
its answer, on each connection. On a machine whose cores the clients share with the server,
what the client's own code adds to an answer (its event loop serving its siblings) is left
out: what a client on its own machine would see, less the network.

    cap = WireCapture.start(port)   # None when tcpdump cannot run here
    ...                             # the traffic
    answers = cap.stop()            # [(status, ms), ...] in capture order
"""
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time

# the first bytes of each packet are enough: headers (link, IP, TCP) and the start of the
# payload, where a request line or a status line is
SNAPLEN = 160
LINKTYPE_ETHERNET = 1
LINKTYPE_LINUX_SLL = 113


class WireCapture:
    def __init__(self, proc, path, port):
        self.proc, self.path, self.port = proc, path, port

    @classmethod
    def start(cls, port):
        """A capture of TCP traffic to and from `port` on loopback, or None when tcpdump is
        missing or may not capture here."""
        tcpdump = shutil.which("tcpdump")
        if not tcpdump or os.geteuid() != 0:
            return None
        fd, path = tempfile.mkstemp(suffix=".pcap")
        os.close(fd)
        proc = subprocess.Popen(
            [tcpdump, "-i", "lo", "-nn", "-s", str(SNAPLEN), "-B", "8192", "-w", path,
             f"tcp port {port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # tcpdump opens the interface before it writes the file's header
        for _ in range(100):
            if os.path.getsize(path) >= 24 or proc.poll() is not None:
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            os.unlink(path)
            return None
        time.sleep(0.2)
        return cls(proc, path, port)

    def stop(self):
        """Ends the capture; the answers seen: (status, ms from the request's last packet)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        try:
            with open(self.path, "rb") as f:
                return answers(read_pcap(f.read()), self.port)
        finally:
            os.unlink(self.path)


def read_pcap(data):
    """(time s, source port, destination port, payload prefix) of each TCP packet that
    carries data."""
    if len(data) < 24:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nano = magic in (0xA1B23C4D, 0x4D3CB2A1)
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    link_len = {LINKTYPE_ETHERNET: 14, LINKTYPE_LINUX_SLL: 16}.get(linktype)
    if link_len is None:
        return []
    out, at = [], 24
    while at + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(endian + "IIII", data[at:at + 16])
        pkt = data[at + 16:at + 16 + incl]
        at += 16 + incl
        ip = pkt[link_len:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:]
        if len(tcp) < 20:
            continue
        sport, dport = struct.unpack(">HH", tcp[:4])
        off = (tcp[12] >> 4) * 4
        if total - ihl - off <= 0:
            continue  # no data: a handshake or an ack
        t = sec + frac / (1e9 if nano else 1e6)
        out.append((t, sport, dport, bytes(tcp[off:off + 16])))
    return out


def answers(packets, port):
    """Per connection (the client's port): each answer's status and the ms from the last
    packet the client sent before it to the answer's first packet."""
    last_sent = {}  # client port -> time of its latest request packet not yet answered
    out = []
    for t, sport, dport, head in packets:
        if dport == port:
            last_sent[sport] = t
        elif sport == port and head.startswith(b"HTTP/1.") and dport in last_sent:
            try:
                status = int(head[9:12])
            except ValueError:
                continue
            out.append((status, (t - last_sent.pop(dport)) * 1000.0))
    return out
