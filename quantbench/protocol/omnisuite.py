"""The built-in media suites, by name: `quantbench-omni-v2` (the default, large enough to decide a verdict on each
modality) and `quantbench-omni-v1` (its first 169 records, kept so older runs' media are found again).

A modality's verdict needs its own questions: an exact copy reads `indistinguishable` only when 0 extra
disagreements in n questions bound the excess under the 2-point margin, which takes n ≥ 189 (the paired score
interval's upper bound at 0 of n is about 3.84 / (n + 3.84)). v1 had 10 records per media family (20 images, 20
audio clips, 10 videos): every media verdict read `inconclusive`. v2 has 200 questions of each modality — image
(image_colour 100, image_side 100), audio (audio_pitch 100, audio_count 100), video (video_motion 200) — and 196
text records (28 per text family), 796 records in all.

Its records are ordered so that its first `SLICE` records are exactly v1's (the text and media generators draw
each family's records in sequence): `quantbench demo --family omni` runs that slice (`--limit 169`) and says so;
`quantbench run --family omni` runs the whole suite. Drawn by quantbench.protocol.omnigen's generators, whose
module this one leaves untouched: the omni default model's recipe hashes that file's bytes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from quantbench.protocol import SuiteRecord, omnigen

V1, V2 = "quantbench-omni-v1", "quantbench-omni-v2"
DEFAULT = V2
SUITES: dict[str, tuple[int, dict[str, int]]] = {  # text records per text family, media records per media family
    V1: (omnigen.SUITE_TEXT_PER_FAMILY, dict.fromkeys(omnigen.MEDIA_FAMILIES, omnigen.SUITE_MEDIA_PER_FAMILY)),
    V2: (28, {"image_colour": 100, "image_side": 100, "audio_pitch": 100, "audio_count": 100, "video_motion": 200}),
}
SLICE_TEXT, SLICE_MEDIA = SUITES[V1]
SLICE = SLICE_TEXT * 7 + sum(SLICE_MEDIA.values())  # 169: v1's records, the first of v2's


def suite_records(suite_id: str = DEFAULT) -> list[SuiteRecord]:
    """The records of a built-in media suite: the text generator's eval split and the media families' eval split,
    v1's composition first."""
    from quantbench.protocol.suitegen import FAMILIES, generate

    text_per_family, media = SUITES[suite_id]
    text = generate("eval", 0, seed=0, families=dict.fromkeys(FAMILIES, text_per_family))
    drawn = omnigen.generate_media("eval", media)
    if suite_id == V1:
        return text + drawn
    n_text, n_media = SLICE_TEXT * len(FAMILIES), sum(SLICE_MEDIA.values())
    return text[:n_text] + drawn[:n_media] + text[n_text:] + drawn[n_media:]


def _generator_hash() -> str:
    from quantbench.protocol import suitegen

    digest = hashlib.sha256(Path(omnigen.__file__).read_bytes() + Path(suitegen.__file__).read_bytes()
                            + Path(__file__).read_bytes())
    return digest.hexdigest()[:12]


def suite_path(suite_id: str = DEFAULT) -> Path:
    """A built-in media suite as a file under the cache (`suites/<generator hash>/<id>.jsonl`, its stem the suite
    id), written once, atomically. v1 is omnigen's own file, as before."""
    if suite_id == V1:
        return omnigen.omni_suite_path()
    from quantbench.protocol.suitegen import dumps

    target = omnigen.suites_dir() / _generator_hash() / f"{suite_id}.jsonl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(dumps(suite_records(suite_id)).encode("utf-8"))
    tmp.rename(target)
    return target


def is_builtin(suite: str | None) -> bool:
    return suite in SUITES
