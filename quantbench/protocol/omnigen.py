"""The media decisions of the omni default model and its built-in suite `quantbench-omni-v1`, generated here.

Five media families, each answerable only from its medium (the question text is the same for every record of a
family, and gold answers are balanced):

    image_colour  a 32 x 64 picture of two squares of different colours and sizes: which colour is the larger one
    image_side    a 32 x 64 picture of one square wholly in its left or right half: which side it is on
    audio_pitch   one second of a tone: high (1.4-2.4 kHz) or low (180-350 Hz)
    audio_count   one second holding one beep or two
    video_motion  four 32 x 64 frames at 2 fps of a square crossing the picture edge to edge, left or right

Every picture, clip and frame is drawn from a seeded `random.Random` and encoded by quantbench itself: a PNG of
stored (uncompressed) deflate blocks and a 16-bit PCM WAV, so the bytes never depend on the zlib or libsndfile a
machine has, and the suite file (its hash covers the data URIs) is the same everywhere. The train and eval splits
draw from their own seeds, and `generate` refuses an eval record whose request also occurs in the train split.

`omni_suite_records()` is the whole built-in suite: the text suite generator's eval split (seven families) and these
media families' eval split; `omni_suite_path()` writes it once under `$QUANTBENCH_CACHE/suites/` (the records carry
their media as data URIs, so the file stands alone) and is what `--suite quantbench-omni-v1` reads.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantbench.paths import cache_dir
from quantbench.protocol import SuiteRecord
from quantbench.protocol.suitegen import Draft, request_text

OMNIGEN_VERSION = 1
OMNI_SUITE_ID = "quantbench-omni-v1"
# Pictures and frames are 32 wide and 64 tall: the tower's patches are 16 px and it merges 2 x 2 of them into one
# token, so each token holds a left and a right patch (which side is then a feature of one token, what a tower
# learns fast, not of the tokens' order, what the decoder would have to read) and a picture is two tokens.
IMAGE_WIDTH, IMAGE_HEIGHT = 32, 64
AUDIO_RATE = 16_000
VIDEO_FRAMES, VIDEO_FPS = 4, 2.0
# The suite: the text generator's eval split and the media families' eval split, records per family.
SUITE_TEXT_PER_FAMILY = 17  # x 7 text families = 119
SUITE_MEDIA_PER_FAMILY = 10  # x 5 media families = 50: 29.6% of 169 records carry media
TRAIN_SEED, EVAL_SEED = 0, 1

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}


def _choice(criteria: dict[str, str]) -> dict[str, Any]:
    return {"type": "choice", "criteria": criteria}


# -- encoders: bytes that depend on nothing but the pixels and samples -----------------------------------------
def png_bytes(pixels: list[bytearray]) -> bytes:
    """An RGB PNG of `pixels` (rows of r, g, b bytes), its deflate stream in stored blocks: no compressor runs."""
    height, width = len(pixels), len(pixels[0]) // 3
    raw = b"".join(b"\x00" + bytes(row) for row in pixels)  # filter type 0 per row
    blocks = bytearray(b"\x78\x01")
    for start in range(0, len(raw), 65535):
        chunk = raw[start : start + 65535]
        last = 1 if start + 65535 >= len(raw) else 0
        blocks += struct.pack("<BHH", last, len(chunk), 0xFFFF ^ len(chunk)) + chunk
    blocks += struct.pack(">I", zlib.adler32(raw))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", bytes(blocks)) + chunk(b"IEND", b"")


def wav_bytes(samples: list[int], rate: int = AUDIO_RATE) -> bytes:
    """A mono 16-bit PCM WAV of `samples` (ints in -32768..32767)."""
    data = struct.pack(f"<{len(samples)}h", *samples)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _uri(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def image_part(pixels: list[bytearray]) -> dict[str, Any]:
    return {"type": "image", "data": _uri("image/png", png_bytes(pixels))}


def audio_part(samples: list[int]) -> dict[str, Any]:
    return {"type": "audio", "data": _uri("audio/wav", wav_bytes(samples))}


# -- drawing ------------------------------------------------------------------------------------------------------
def _canvas(rng: random.Random) -> list[bytearray]:
    grey = rng.randint(0, 40)  # a dark background of varying shade
    return [bytearray([grey] * (3 * IMAGE_WIDTH)) for _ in range(IMAGE_HEIGHT)]


def _square(pixels: list[bytearray], x: int, y: int, size: int, rgb: tuple[int, int, int]) -> None:
    for row in range(max(0, y), min(IMAGE_HEIGHT, y + size)):
        for col in range(max(0, x), min(IMAGE_WIDTH, x + size)):
            pixels[row][3 * col : 3 * col + 3] = bytes(rgb)


def _jitter(rng: random.Random, rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(min(255, max(0, c + rng.randint(-25, 25))) for c in rgb)  # type: ignore[return-value]


def _tone(rng: random.Random, spans: list[tuple[float, float]], freq: float, amplitude: float) -> list[int]:
    """One second of faint seeded noise with a sine of `freq` Hz in each (start, end) span, faded in and out
    over 10 ms, as 16-bit samples."""
    import numpy as np  # lazy: the text suite needs none of this

    t = np.arange(AUDIO_RATE, dtype=np.float64) / AUDIO_RATE
    value = np.random.default_rng(rng.getrandbits(64)).uniform(-0.01, 0.01, AUDIO_RATE)
    for start, end in spans:
        inside = (t >= start) & (t < end)
        edge = np.minimum(1.0, np.minimum((t - start) / 0.01, (end - t) / 0.01))
        value += np.where(inside, amplitude * edge * np.sin(2 * np.pi * freq * (t - start)), 0.0)
    return np.clip(np.rint(value * 32767), -32768, 32767).astype(int).tolist()


# -- the media families: (rng, gold) -> (state, questions, gold) --------------------------------------------------
def image_colour(rng: random.Random, gold: str) -> Draft:
    pixels = _canvas(rng)
    other = rng.choice([c for c in COLOURS if c != gold])
    big, small = rng.randint(15, 19), rng.randint(4, 7)
    # the two squares side by side (which side the big one is on is random), never overlapping
    big_left = rng.random() < 0.5
    bx = rng.randint(0, 2) if big_left else rng.randint(IMAGE_WIDTH - big - 2, IMAGE_WIDTH - big)
    sx = rng.randint(IMAGE_WIDTH - small - 4, IMAGE_WIDTH - small) if big_left else rng.randint(0, 4)
    _square(pixels, bx, rng.randint(0, IMAGE_HEIGHT - big), big, _jitter(rng, COLOURS[gold]))
    _square(pixels, sx, rng.randint(0, IMAGE_HEIGHT - small), small, _jitter(rng, COLOURS[other]))
    question = _choice({c: f"The larger shape is {c}" for c in COLOURS})
    return {"picture": image_part(pixels)}, {"larger_colour": question}, {"larger_colour": gold}


def image_side(rng: random.Random, gold: str) -> Draft:
    pixels = _canvas(rng)
    size = rng.randint(8, 14)
    half = IMAGE_WIDTH // 2  # the shape lies wholly in its half: in the left or the right column of patches
    x = rng.randint(0, half - size) if gold == "left" else rng.randint(half, IMAGE_WIDTH - size)
    _square(pixels, x, rng.randint(0, IMAGE_HEIGHT - size), size, _jitter(rng, rng.choice(list(COLOURS.values()))))
    question = _choice({"left": "The shape is on the left side", "right": "The shape is on the right side"})
    return {"picture": image_part(pixels)}, {"side": question}, {"side": gold}


def audio_pitch(rng: random.Random, gold: str) -> Draft:
    freq = rng.uniform(1400, 2400) if gold == "high" else rng.uniform(180, 350)
    start = rng.uniform(0.0, 0.3)
    samples = _tone(rng, [(start, start + rng.uniform(0.4, 0.6))], freq, rng.uniform(0.3, 0.7))
    question = _choice({"high": "A high-pitched tone", "low": "A low-pitched tone"})
    return {"sound": audio_part(samples)}, {"pitch": question}, {"pitch": gold}


def audio_count(rng: random.Random, gold: str) -> Draft:
    length = rng.uniform(0.12, 0.2)
    if gold == "one":
        start = rng.uniform(0.1, 0.6)
        spans = [(start, start + length)]
    else:
        first = rng.uniform(0.05, 0.25)
        second = first + length + rng.uniform(0.25, 0.4)
        spans = [(first, first + length), (second, second + length)]
    samples = _tone(rng, spans, rng.uniform(500, 1200), rng.uniform(0.3, 0.7))
    question = _choice({"one": "One beep", "two": "Two beeps"})
    return {"sound": audio_part(samples)}, {"beeps": question}, {"beeps": gold}


def video_motion(rng: random.Random, gold: str) -> Draft:
    size = rng.randint(8, 12)
    travel = IMAGE_WIDTH - size  # across the whole picture, edge to edge, in three equal steps
    y = rng.randint(0, IMAGE_HEIGHT - size)
    rgb = _jitter(rng, rng.choice(list(COLOURS.values())))
    grey = rng.randint(0, 40)
    frames = []
    for i in range(VIDEO_FRAMES):
        pixels = [bytearray([grey] * (3 * IMAGE_WIDTH)) for _ in range(IMAGE_HEIGHT)]
        step = round(i * travel / (VIDEO_FRAMES - 1))
        _square(pixels, step if gold == "right" else travel - step, y, size, rgb)
        frames.append(_uri("image/png", png_bytes(pixels)))
    question = _choice({"left": "The square moves to the left", "right": "The square moves to the right"})
    return {"clip": {"type": "video", "frames": frames, "fps": VIDEO_FPS}}, {"direction": question}, {"direction": gold}


MEDIA_FAMILIES: dict[str, tuple[Callable[[random.Random, str], Draft], tuple[str, ...]]] = {
    "image_colour": (image_colour, tuple(COLOURS)),
    "image_side": (image_side, ("left", "right")),
    "audio_pitch": (audio_pitch, ("high", "low")),
    "audio_count": (audio_count, ("one", "two")),
    "video_motion": (video_motion, ("left", "right")),
}


# -- splits ---------------------------------------------------------------------------------------------------------
def _drafts(split: str, family: str, n: int, seed: int) -> list[dict[str, Any]]:
    make, answers = MEDIA_FAMILIES[family]
    rng = random.Random(f"quantbench-omnigen:{OMNIGEN_VERSION}:{split}:{seed}:{family}")
    out = []
    for i in range(n):
        state, questions, gold = make(rng, answers[i % len(answers)])  # gold balanced: answers in turn
        out.append({"request": {"state": state, "questions": questions}, "gold": gold})
    return out


def _split_seed(split: str) -> int:
    if split not in ("eval", "train"):
        raise ValueError(f"split must be 'eval' or 'train', not {split!r}")
    return EVAL_SEED if split == "eval" else TRAIN_SEED


def request_digest(request: dict[str, Any]) -> str:
    return hashlib.sha256(request_text(request).encode()).hexdigest()


def generate_media(split: str, families: dict[str, int]) -> list[SuiteRecord]:
    """Media records of `split`, `families[name]` of each, interleaved round-robin; ids `{family}-{i:04d}`. The
    eval split is checked disjoint from the train split of the same sizes (ValueError naming a shared record)."""
    unknown = set(families) - set(MEDIA_FAMILIES)
    if unknown:
        raise ValueError(f"unknown media families {sorted(unknown)}; known: {list(MEDIA_FAMILIES)}")
    drafts = {name: _drafts(split, name, n, _split_seed(split)) for name, n in families.items()}
    if split == "eval":
        train = {request_digest(d["request"]) for name, n in families.items()
                 for d in _drafts("train", name, max(n, TRAIN_CHECK), TRAIN_SEED)}
        for name, items in drafts.items():
            for i, d in enumerate(items):
                if request_digest(d["request"]) in train:
                    raise ValueError(f"{name}-{i:04d}: the eval request also occurs in the train split")
    records = []
    for i in range(max(families.values(), default=0)):
        for name, items in drafts.items():
            if i < len(items):
                records.append(SuiteRecord.model_validate({"id": f"{name}-{i:04d}", "benchmark": name, **items[i]}))
    return records


TRAIN_CHECK = 400  # eval records are checked against this many train records per family (what the fixture trains on)


def omni_suite_records() -> list[SuiteRecord]:
    """The built-in omni suite: the text eval split (the same generator and seed as the default suite) then the
    media eval split, each family's records interleaved."""
    from quantbench.protocol.suitegen import FAMILIES, generate

    text = generate("eval", 0, seed=0, families=dict.fromkeys(FAMILIES, SUITE_TEXT_PER_FAMILY))
    media = generate_media("eval", dict.fromkeys(MEDIA_FAMILIES, SUITE_MEDIA_PER_FAMILY))
    return text + media


def suites_dir() -> Path:
    return cache_dir() / "suites"


def omni_suite_bytes() -> bytes:
    """The built-in omni suite's JSONL bytes (the same on every machine)."""
    from quantbench.protocol.suitegen import dumps

    return dumps(omni_suite_records()).encode("utf-8")


def _generator_hash() -> str:
    """The generators' source: a changed template or drawing writes the suite again, in a folder of its own."""
    from quantbench.protocol import suitegen

    digest = hashlib.sha256(Path(__file__).read_bytes() + Path(suitegen.__file__).read_bytes())
    return digest.hexdigest()[:12]


def omni_suite_path() -> Path:
    """The built-in omni suite as a file, `suites/<generator hash>/quantbench-omni-v1.jsonl` under the cache (its
    stem is the suite id), written once, atomically."""
    target = suites_dir() / _generator_hash() / f"{OMNI_SUITE_ID}.jsonl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(omni_suite_bytes())
    tmp.rename(target)
    return target
