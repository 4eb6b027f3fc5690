"""The parity page on media decisions, under AppTest: the modality filter and per-modality breakdown, and the
viewer that shows a decision's picture / waveform / video frames beside every variant's probabilities, with the
media found again in the suite file (the store keeps answers, not media)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.report import build_report
from quantbench.store import Store
from tests import dashboard_media_store as dms

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("dashmedia")
    store, suite = dms.build(root / "results.duckdb", root / "suite")
    return store.path, suite


@pytest.fixture
def store(built, monkeypatch) -> Store:
    monkeypatch.setenv("QUANTBENCH_DB", str(built[0]))
    return Store(built[0])


def parity(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"gpu": "cpu", "variant": dms.VISION_BROKEN, **query})
    at.run()
    at.switch_page("page_parity.py").run()
    assert not at.exception, at.exception
    return at


def frame(at: AppTest, caption_start: str):
    """The dataframe drawn right after the caption that starts with `caption_start`."""
    return next(df for df in at.dataframe if df.value is not None and caption_start in " ".join(
        c.value for c in at.caption)).value


def plotly(at: AppTest) -> list[dict]:
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def title(fig: dict) -> str:
    return fig["layout"].get("title", {}).get("text", "")


def images(at: AppTest) -> list[str]:
    return [c for e in at.get("image") for c in e.captions]


def comparison(store: Store):
    [rep] = build_report(store, model=dms.MODEL)
    return next(r.comparison for r in rep.rows if r.label == dms.VISION_BROKEN)


def flips_table(at: AppTest):
    return next(df.value for df in at.dataframe if "top_cand" in df.value.columns and "tv" in df.value.columns)


def test_the_modality_filter_offers_the_stored_modalities_and_cuts_the_flips(store):
    at = parity()
    box = at.selectbox(key="modality")
    assert box.options == ["all", "text", "image", "audio", "video", "mixed"]
    per_q = comparison(store).per_question
    flipped = per_q[~per_q["agree"].astype(bool)]
    assert len(flips_table(at)) == len(flipped)
    box.set_value("image").run()
    assert not at.exception, at.exception
    assert at.query_params["modality"] == "image"
    shown = flips_table(at)
    assert set(shown["modality"]) == {"image"}
    assert len(shown) == int((flipped["modality"] == "image").sum()) > 0
    # the headline figures are the image questions' own
    agree = next(m for m in at.metric if m.label == "Agrees with BF16")
    image_q = per_q[per_q["modality"] == "image"]
    assert agree.value == f"{image_q['agree'].mean():.1%}"


def test_the_viewer_shows_the_picture_beside_every_variants_probabilities(store, built):
    at = parity(modality="image", suite=str(built[1]))
    decision = at.selectbox(key="decision")
    assert decision.value.startswith("image-") and "differs: " + dms.VISION_BROKEN in decision.value
    assert at.query_params["decision"] == decision.value.split(" · ")[0]
    shown = images(at)
    assert len(shown) == 1 and shown[0] == "state.camera: image 64×64"
    probs = next(f for f in plotly(at) if "probability per option" in title(f))
    names = [t["name"] for t in probs["data"]]
    assert names[0] == "bf16" and dms.VISION_BROKEN in names and "int4" in names
    assert len(names) == 4  # the reference, the noise floor and both candidates
    assert not any("Media unavailable" in w.value for w in at.warning)


def test_the_viewer_draws_a_waveform_for_audio_and_the_frames_of_a_video(store, built):
    at = parity(modality="mixed", suite=str(built[1]), variant="int4")
    # the mixed records (a picture and a tone) only flip for the broken variant
    assert "differs: " + dms.VISION_BROKEN in at.selectbox(key="decision").value
    assert images(at) == ["state.camera: image 64×64"]
    wave = [f for f in plotly(at) if title(f).startswith("state.microphone: audio")]
    assert len(wave) == 1 and title(wave[0]) == "state.microphone: audio, 1.00 s"
    assert len(at.get("audio")) == 1
    assert any(c.value.startswith("strongest frequency 880 Hz") for c in at.caption)  # mixed-000: the high tone
    at.selectbox(key="modality").set_value("audio").run()
    assert len(at.selectbox(key="decision").options) == 2  # the two near-ties both INT4 variants flip
    at.toggle(key="every_media").set_value(True).run()
    options = at.selectbox(key="decision").options
    assert len(options) == dms.N["audio"] and sum(o.endswith("all agree") for o in options) == dms.N["audio"] - 2
    at.selectbox(key="modality").set_value("video").run()
    assert not at.exception, at.exception
    assert images(at) == [f"frame {i + 1} · {i / 2:.2f} s" for i in range(4)]
    assert any("state.clip: video, 4 frames at 2 fps (2.00 s)" in c.value for c in at.caption)


def test_without_the_suite_the_viewer_says_the_media_is_unavailable_and_still_shows_the_probabilities(store):
    at = parity(modality="image")
    [warning] = [w.value for w in at.warning if "Media unavailable" in w.value]
    assert "the store keeps answers, not media" in warning.lower() and "not a suite quantbench generates" in warning
    assert images(at) == []
    assert any("probability per option" in title(f) for f in plotly(at))


def test_a_suite_file_of_another_hash_is_named_and_not_shown(store, built, tmp_path):
    other = tmp_path / "suite"
    shutil.copytree(built[1].parent, other)
    moved = other / built[1].name
    moved.write_text(moved.read_text().replace('"Fact number 0."', '"Fact number zero."'))
    at = parity(modality="image", suite=str(moved))
    [warning] = [w.value for w in at.warning if "Media unavailable" in w.value]
    assert str(moved) in warning and "not the" in warning and "other decisions or other media" in warning
    assert images(at) == []


def test_the_runs_own_suite_path_is_found_without_being_told(tmp_path, monkeypatch):
    store, _ = dms.build(tmp_path / "results.duckdb", tmp_path / "suite", spec_suite=True)
    monkeypatch.setenv("QUANTBENCH_DB", str(store.path))
    at = parity(modality="image")
    assert images(at) == ["state.camera: image 64×64"]


def test_find_suite_takes_the_first_file_of_the_runs_hash_then_a_built_in_suite(built, tmp_path):
    from quantbench.analysis.decision_media import Limits, find_suite
    from quantbench.protocol.suite import BUILTIN_SUITE_ID, load_suite

    suite = load_suite(built[1])
    missing = tmp_path / "gone.jsonl"
    found = find_suite(suite.id, suite.hash, [str(missing), str(built[1])], Limits())
    assert found.suite is not None and found.source == str(built[1]) and found.tried == (str(missing), str(built[1]))
    builtin = load_suite(None)
    found = find_suite(BUILTIN_SUITE_ID, builtin.hash, [str(built[1])], Limits())
    assert found.source == f"built-in {BUILTIN_SUITE_ID}" and found.suite.hash == builtin.hash
    lost = find_suite(suite.id, suite.hash, [str(missing)], Limits())
    assert lost.suite is None and f"`{missing}` is not a file here" in lost.problem
    assert f"{suite.id} is not a suite quantbench generates" in lost.problem


def test_the_built_in_omni_suite_is_found_by_its_id_and_its_media_decode(tmp_path, monkeypatch):
    from quantbench.analysis.decision_media import Limits, find_suite, record_media
    from quantbench.protocol import modality_of, omnigen

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path))  # generated here, as on a machine that never ran it
    expected = load_suite_bytes_hash(omnigen.omni_suite_bytes())
    found = find_suite(omnigen.OMNI_SUITE_ID, expected, [], Limits())
    assert found.suite is not None and found.source == f"built-in {omnigen.OMNI_SUITE_ID}"
    kinds = {modality_of(r): r.id for r in found.suite.records}
    assert {"image", "audio", "video"} <= set(kinds)
    for kind in ("image", "audio", "video"):
        [medium] = record_media(found.suite, kinds[kind], Limits())
        assert type(medium).__name__ == f"Decoded{kind.capitalize()}"
    other = find_suite(omnigen.OMNI_SUITE_ID, "0" * 64, [], Limits())
    assert other.suite is None and "another quantbench version made it" in other.problem


def load_suite_bytes_hash(raw: bytes) -> str:
    import hashlib

    return hashlib.sha256(raw).hexdigest()  # the suite's media are inline: its hash is its bytes'


def test_the_parity_page_shows_the_tests_and_lists_the_confident_flips_with_their_questions(store):
    """McNemar against BF16 and the floor, the TOST verdict with its margin, and every question BF16 answered
    confidently that the variant flipped, read from the answers' stored margins (issue #35 items 1 and 2)."""
    from quantbench.analysis import significance as sig

    at = parity()
    assert "Tests" in [h.value for h in at.subheader] and "Confident flips" in [h.value for h in at.subheader]
    labels = [m.label for m in at.metric]
    assert "McNemar vs BF16 (exact p)" in labels and "McNemar vs noise floor (exact p)" in labels
    assert "Equivalence (TOST), margin card" in labels
    captions = " ".join(c.value for c in at.caption)
    assert "near-tie (< 0.1)" in captions and "TV per question p50 / p90 / p99 / max" in captions
    flips = next(df.value for df in at.dataframe if "ref_margin" in df.value.columns and "BF16" in df.value.columns)
    expected = sig.confident_flips(comparison(store).per_question)
    assert len(flips) == len(expected) > 0 and (flips["ref_margin"] >= sig.CONFIDENT - 1e-9).all()
    assert set(zip(flips["record_id"], flips["question"], strict=True)) == set(
        zip(expected["record_id"], expected["question"], strict=True))
    image = parity(modality="image")  # cut to one modality, as the flipped questions are
    cut = next(df.value for df in image.dataframe if "ref_margin" in df.value.columns and "BF16" in df.value.columns)
    assert set(cut["modality"]) == {"image"} and len(cut) < len(flips)
