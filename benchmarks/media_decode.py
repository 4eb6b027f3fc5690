"""Decode and refusal times of quantbench.protocol.media on generated media (docs/BENCHMARKS.md, issue #24 part 5):
best of 5 per part, decode_part with the default limits. The media are made by the helpers of tests/test_media.py.

    PYTHONPATH=. python benchmarks/media_decode.py
"""

from __future__ import annotations

import io
import time

import numpy as np
import soundfile

from quantbench.errors import RequestError
from quantbench.limits import Limits
from quantbench.protocol.media import decode_part
from tests.test_media import audio_bytes, image_bytes, mp4_bytes, png_30000_squared, uri


def ms(part: dict, n: int = 5) -> tuple[float, str]:
    best = 1e9
    for _ in range(n):
        t = time.perf_counter()
        try:
            decode_part("state.x", part, Limits())
        except RequestError as e:
            out = f"refused: {e.problem[:60]}"
        else:
            out = "decoded"
        best = min(best, time.perf_counter() - t)
    return best * 1e3, out


b = io.BytesIO()
with soundfile.SoundFile(b, "w", samplerate=8000, channels=1, format="FLAC", subtype="PCM_16") as f:
    for _ in range(120):
        f.write(np.zeros(8000 * 60, np.int16))
bomb = png_30000_squared()
cases = {
    "PNG 448x448": {"type": "image", "data": uri("image/png", image_bytes("PNG", (448, 448)))},
    "WAV 5 s 16 kHz": {"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 5.0))},
    "WAV 5 s 44.1 kHz stereo": {"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 5.0, 44100, 2))},
    "mp4 8 frames 64x64 2 fps": {"type": "video", "data": uri("video/mp4", mp4_bytes(8, 2, 64, bars=True))},
    f"PNG 30000x30000 ({len(bomb)} B)": {"type": "image", "data": uri("image/png", bomb)},
    f"FLAC 2 h ({len(b.getvalue())} B)": {"type": "audio", "data": uri("audio/flac", b.getvalue())},
    "mp4 10000 frames 16x16": {"type": "video", "data": uri("video/mp4", mp4_bytes(10000, 100))},
}
print("| part | ms | result |\n|---|---|---|")
for name, part in cases.items():
    t, out = ms(part)
    print(f"| {name} | {t:.1f} | {out} |")
