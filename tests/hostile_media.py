"""Hostile media for the tests of issue #33, each built here in well under a second (no blobs): the bytes that
steered FFmpeg (an SDP description, an ffconcat list), the decode bombs (a 59 KB mp4 of 256 4096^2 frames, a
170 KB FLAC of 8 channels at 655,350 Hz for 480 s), and a way to watch a process's sockets and peak memory."""

from __future__ import annotations

import fractions
import io
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def sdp(port: int) -> bytes:
    """An SDP description asking its reader to receive H.264 over RTP on UDP `port` (FFmpeg's probing opened
    it, bound the port on 0.0.0.0 and waited 10 s for packets)."""
    return (f"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\nm=video {port} RTP/AVP 96\n"
            "a=rtpmap:96 H264/90000\n").encode()


def ffconcat(name: str) -> bytes:
    """An ffconcat list naming a file relative to the reader's working folder (FFmpeg's probing opened it)."""
    return f"ffconcat version 1.0\nfile '{name}'\n".encode()


def mp4_repeating(frames: int = 256, size: int = 4096, fps: int = 25) -> bytes:
    """An H.264 mp4 of `frames` black `size`^2 frames: one keyframe encoded, then the same tiny skip-frame packet
    muxed again and again, so it is built in half a second and stays small (256 frames of 4096^2: 59 KB, 12.9 GB
    decoded)."""
    import av

    enc = av.CodecContext.create("libx264", "w")
    enc.width = enc.height = size
    enc.pix_fmt, enc.time_base, enc.framerate = "yuv420p", fractions.Fraction(1, fps), fractions.Fraction(fps)
    enc.options = {"preset": "ultrafast", "tune": "zerolatency"}
    enc.gop_size = 1000
    black = av.VideoFrame(size, size, "yuv420p")
    for i, plane in enumerate(black.planes):
        plane.update((b"\0" if i == 0 else b"\x80") * plane.buffer_size)
    packets = []
    for i in range(2):
        black.pts = i
        packets += enc.encode(black)
    packets += enc.encode(None)
    key, skip = bytes(packets[0]), bytes(packets[1])
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("h264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.extradata = enc.extradata
        for i in range(frames):
            packet = av.Packet(key if i == 0 else skip)
            packet.pts = packet.dts = i
            packet.time_base, packet.stream, packet.is_keyframe = fractions.Fraction(1, fps), stream, i == 0
            out.mux(packet)
    return buf.getvalue()


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16_table() -> list[int]:
    table = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x8005) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
        table.append(c)
    return table


CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ CRC16[(crc >> 8) ^ byte]
    return crc


def _coded_number(n: int) -> bytes:
    """FLAC's UTF-8-like coding of a frame number."""
    if n < 0x80:
        return bytes([n])
    length = next(k for k in range(2, 8) if n < 1 << (5 * k + 1))
    tail = []
    for _ in range(length - 1):
        tail.append(0x80 | (n & 0x3F))
        n >>= 6
    return bytes([((0xFF << (8 - length)) & 0xFF) | n, *tail[::-1]])


def flac_of_silence(rate: int = 655_350, channels: int = 8, seconds: int = 480, block: int = 65_535) -> bytes:
    """A valid FLAC stream of silence written frame by frame (each channel a CONSTANT subframe of 0): the FLAC
    bomb of issue #33 (8 channels at 655,350 Hz for 480 s: 170 KB, 10 GB decoded as float32) in 0.2 s."""
    total = rate * seconds
    streaminfo = struct.pack(">HH", block, block) + b"\0" * 6
    streaminfo += ((rate << 44) | ((channels - 1) << 41) | (15 << 36) | total).to_bytes(8, "big") + b"\0" * 16
    out = [b"fLaC", b"\x80" + len(streaminfo).to_bytes(3, "big") + streaminfo]
    subframes = b"\0\0\0" * channels
    done = n = 0
    while done < total:
        size = min(block, total - done)
        head = b"\xff\xf8" + bytes([0x70, ((channels - 1) << 4) | 0x08]) + _coded_number(n) + struct.pack(">H", size - 1)
        frame = head + bytes([_crc8(head)]) + subframes
        out.append(frame + struct.pack(">H", _crc16(frame)))
        done, n = done + size, n + 1
    return b"".join(out)


def peak_rss_reset() -> None:
    """Reset this process's peak resident memory (VmHWM) to its current RSS (Linux 4.0+: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """This process's peak resident memory since the last reset, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@contextmanager
def watching_udp(ports: set[int]) -> Iterator[set[int]]:
    """While inside, every 5 ms: the UDP ports of `ports` this process has a socket on (the set yielded fills)."""
    import psutil

    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        me = psutil.Process()
        while not stop.is_set():
            seen.update(c.laddr.port for c in me.net_connections(kind="udp") if c.laddr and c.laddr.port in ports)
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


@contextmanager
def fifo_marker(path: Path) -> Iterator[threading.Event]:
    """A FIFO at `path` and an Event set as soon as anything opens it for reading (a writer blocks until then):
    a file whose opening cannot go unnoticed."""
    os.mkfifo(path)
    opened = threading.Event()

    def writer() -> None:
        with open(path, "wb"):  # blocks until a reader opens the FIFO
            opened.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        if not opened.is_set():  # release the writer: open the read end ourselves
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            thread.join(5)
            os.close(fd)
        path.unlink()

