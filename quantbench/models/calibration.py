"""Calibration inputs for the quantizers (quantbench.make.quantize) and the synthetic shapes' one calibration
forward (quantbench.models.synthetic): decision records rendered as the runner renders them. It is with the readers
because a `--shape` run's child calibrates its in-memory quantization with calibration_prompt at load time.

By default the records are the suite generator's train split (calibration_texts). With `quantbench quantize
--calibration FILE.jsonl` they are the user's own suite lines (load_calibration, file_samples): each question of a
record is its prompt followed by its `gold` answer when the record has one, else the prompt alone.

The quantizers feed the model one batch at a time as keyword inputs (`model(**inputs)`). A text record is packed
with the records after it into texts of at least `seqlen` tokens, cut to `seqlen`: a text batch is `input_ids` +
`attention_mask` (calibration_inputs). A record carrying media (a Qwen3-Omni thinker's image, audio or video) is
one sample per question, made by the model family's decision engine (its `media_engine`: for Qwen3-Omni,
OmniEngine.prepare: the state rendered with its placeholders, the parts decoded under the media limits, the
checkpoint's processor run):
`input_ids` with the media placeholders expanded, `attention_mask`, and the tower inputs the thinker's forward
needs (`pixel_values` + `image_grid_thw`, `input_features` + `feature_attention_mask`, `pixel_values_videos` +
`video_grid_thw` + `video_second_per_grid`), so the calibration forward runs the towers exactly as a decision
does. Such a sample is never packed nor cut (a cut inside a media span would not match its pixels or features).
A model that reads text only refuses a record with media, naming the record and the field (refuse_file_media).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantbench.errors import ConfigError, QuantbenchError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import SuiteRecord, refuse_unread_media
from quantbench.protocol.prompt import answer_text, render_prompt
from quantbench.protocol.suitegen import generate

if TYPE_CHECKING:  # only annotations: the parent imports the quantizers (run.resolve) without importing torch
    from torch import Tensor

MEDIA_INPUT_OF = {"pixel_values": "image", "input_features": "audio", "pixel_values_videos": "video"}


class _Packs:
    """Texts packed in order into groups of at least `seqlen` tokens (AutoRound drops shorter texts), with a
    margin: tokens merge differently across the blank lines that join them."""

    def __init__(self, tokenizer: Any, seqlen: int):
        self.tokenizer, self.target = tokenizer, seqlen + seqlen // 10 + 8
        self.open: list[tuple[Any, str]] = []
        self.tokens = 0

    def add(self, tag: Any, text: str) -> list[tuple[Any, str]] | None:
        """Add one (tag, text); the group it completes, or None while the open group is short."""
        self.open.append((tag, text))
        self.tokens += len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + 2  # + the blank line
        if self.tokens < self.target:
            return None
        full, self.open, self.tokens = self.open, [], 0
        return full


def _joined(group: list[tuple[Any, str]]) -> str:
    return "\n\n".join(text for _, text in group)


def _train_split(tokenizer: Any, nsamples: int, seed: int) -> Iterator[str]:
    """Every question of the generator's train records, rendered with its gold answer (the first option when
    a record has none), round after round of records."""
    for rounds in range(64):
        for rec in generate("train", max(64, nsamples * 4), seed=seed + rounds):
            for name, question in rec.request.questions.items():
                gold = (rec.gold or {}).get(name, question.options[0])
                yield render_prompt(tokenizer, rec.request, name) + answer_text(tokenizer, question, gold)
    raise QuantbenchError("calibration: the suite generator ran dry; ask for fewer or shorter samples")


def calibration_texts(tokenizer: Any, nsamples: int, seqlen: int, seed: int = 0) -> list[str]:
    """`nsamples` texts of at least `seqlen` tokens, each a run of train-split decision records rendered as the
    runner renders them (quantbench.protocol.prompt.render_prompt) followed by the gold answer, joined by blank lines.
    AutoRound drops texts shorter than seqlen, hence the packing."""
    packs, texts = _Packs(tokenizer, seqlen), []
    for text in _train_split(tokenizer, nsamples, seed):
        if (full := packs.add(None, text)) is not None:
            texts.append(_joined(full))
            if len(texts) == nsamples:
                break
    return texts


def calibration_inputs(tokenizer: Any, texts: list[str], seqlen: int, batch: int = 8) -> list[dict[str, Tensor]]:
    """The texts' token ids cut to `seqlen`, as the forward's keyword inputs (`input_ids`, `attention_mask`), in
    batches of up to `batch` rows of equal length (the texts are packed to at least seqlen tokens, so nearly all
    are full rows, and no row is padded)."""
    import torch

    by_length: dict[int, list[list[int]]] = {}
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=seqlen)["input_ids"]
        by_length.setdefault(len(ids), []).append(ids)
    out = []
    for rows in by_length.values():
        for i in range(0, len(rows), batch):
            ids = torch.tensor(rows[i : i + batch])
            out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return out


def calibration_prompt(tokenizer: Any, seqlen: int = 512) -> Tensor:
    """One packed text of train-split decision records, as the quantizers calibrate on, as input ids."""
    text = calibration_texts(tokenizer, 1, seqlen)[0]
    return tokenizer(text, add_special_tokens=False, return_tensors="pt", truncation=True, max_length=seqlen)["input_ids"]


# -- a calibration file: the user's own decision records ----------------------------------------------------------
@dataclass(frozen=True)
class CalibrationFile:
    """A `--calibration FILE.jsonl`: suite lines, loaded and checked as a run loads its suite."""

    path: Path
    sha256: str  # the file's bytes
    hash: str  # the file's and its media files' bytes (the suite hash): what the recipe records
    records: list[SuiteRecord]

    def refuse_media(self, modalities: frozenset[str]) -> None:
        """ConfigError naming the first record and field carrying media the model has no input for (every media
        part, for a text-only model)."""
        for rec in self.records:
            try:
                refuse_unread_media(rec.request, modalities, where=f"record {rec.id}: ")
            except RequestError as e:
                raise ConfigError(f"--calibration {self.path}: {e}") from None


def load_calibration(path: str | Path, limits: Limits | None = None) -> CalibrationFile:
    """The calibration file at `path`, every record checked as `quantbench run` checks a suite's (the JSON, the
    media parts against `limits`, each `path` inside the file's folder): a ConfigError names file:line and field."""
    from quantbench.protocol.suite import load_suite

    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"--calibration {source}: no such file; give a JSONL file of decision records (suite lines: "
                          "id, benchmark, request, gold)")
    try:
        suite = load_suite(source, limits=limits)
    except ConfigError as e:
        raise ConfigError(f"--calibration: {e}") from None
    return CalibrationFile(source.resolve(), hashlib.sha256(source.read_bytes()).hexdigest(), suite.hash,
                           suite.records)


def record_text(tokenizer: Any, record: SuiteRecord, name: str) -> str:
    """Question `name` of a text record as calibration reads it: the prompt, then the gold answer if it has one."""
    question = record.request.questions[name]
    gold = (record.gold or {}).get(name)
    prompt = render_prompt(tokenizer, record.request, name)
    return prompt + answer_text(tokenizer, question, gold) if gold is not None else prompt


MediaSamples = Callable[[SuiteRecord], list[dict[str, Any]]]


def file_samples(cal: CalibrationFile, tokenizer: Any, nsamples: int, seqlen: int,
                 media: MediaSamples | None = None) -> tuple[list[str | dict[str, Any]], dict[str, Any]]:
    """Up to `nsamples` calibration samples from `cal`, in file order, and their provenance. Text records are
    packed (a text of at least `seqlen` tokens; a last one short of it is left out); each question of a record
    with media is a sample of its own, a dict of forward inputs made by `media` (None: the model reads text
    only, and a record with media is refused naming its field). A ConfigError when no sample can be made."""
    if media is None:
        cal.refuse_media(frozenset())
    packs = _Packs(tokenizer, seqlen)
    samples: list[str | dict[str, Any]] = []
    users: list[set[str]] = []  # the records in each sample
    for rec in cal.records:
        if len(samples) >= nsamples:
            break
        if rec.request.media_parts():
            made = media(rec)[: nsamples - len(samples)]
            samples += made
            users += [{rec.id}] * len(made)
            continue
        for name in rec.request.questions:
            if (full := packs.add(rec.id, record_text(tokenizer, rec, name))) is not None:
                samples.append(_joined(full))
                users.append({tag for tag, _ in full})
                if len(samples) >= nsamples:
                    break
    if not samples:
        raise ConfigError(f"--calibration {cal.path}: its text records make no sample of --seqlen {seqlen} tokens "
                          "(records are packed until a sample has that many); add records or lower --seqlen")
    used = set().union(*users)
    with_media = {kind: sum(1 for rec in cal.records if rec.id in used
                            and any(part["type"] == kind for _, part in rec.request.media_parts()))
                  for kind in ("image", "audio", "video")}
    return samples, {
        "file": str(cal.path), "sha256": cal.sha256, "hash_with_media_files": cal.hash,
        "records_in_file": len(cal.records), "records_used": len(used), "records_with": with_media,
        "samples": len(samples), "text_samples": sum(isinstance(s, str) for s in samples),
        "media_samples": sum(isinstance(s, dict) for s in samples),
        "rendered": "each question: its prompt as quantbench.protocol.prompt renders it, then its gold answer "
                    "when the record has one; text records packed to --seqlen tokens; a record with media one "
                    "sample per question through the decision engine's media path and the checkpoint's processor",
    }


def media_sampler(model: Any, tokenizer: Any, checkpoint: Path, cal: CalibrationFile) -> MediaSamples | None:
    """For a model of a family that reads media (a Qwen3-Omni thinker), loaded from `checkpoint`: the function
    making a media record's samples, each question's prompt (+ gold answer) through the family's engine's prepare
    (OmniEngine.prepare: the placeholders, the parts decoded under the default media limits with `path` read from
    the file's folder, the checkpoint's processor, quantbench's audio check) as the forward's keyword inputs; None
    when the model reads text only. The file's records are checked against what the checkpoint reads first
    (ConfigError naming record and field)."""
    from quantbench.models.families import family_of_model, supports_multimodal

    family = family_of_model(model)
    processor = family.media_processor(checkpoint, tokenizer, model) if supports_multimodal(family) else None
    cal.refuse_media(processor.modalities if processor is not None else frozenset())
    if processor is None:
        return None
    engine = family.media_engine(model, tokenizer, media=processor, limits=Limits(), media_base=cal.path.parent,
                                 cuda_graph="off", fused_ops="off")

    def samples(rec: SuiteRecord) -> list[dict[str, Any]]:
        import torch

        try:
            prepared = engine.prepare(rec.request)
        except RequestError as e:
            raise ConfigError(f"--calibration {cal.path}: record {rec.id}: {e}") from None
        out = []
        for reader in prepared.readers:
            gold = (rec.gold or {}).get(reader.question)
            first = reader.rows[0]
            if reader.method == "label_logit":  # one row, the prompt: the answer is its label's token
                ids = prepared.rows[first] + ([reader.label_ids[reader.options.index(gold)]] if gold else [])
            elif gold is not None:  # a row per option, prompt + option: the gold one
                ids = prepared.rows[reader.rows[reader.options.index(gold)]]
            else:
                ids = prepared.rows[first][: reader.spans[0][0]]
            row = torch.tensor([ids])
            media = family.media_inputs(prepared.media[first], torch.device("cpu"), model.dtype)
            out.append({"input_ids": row, "attention_mask": torch.ones_like(row), **media})
        return out

    return samples


def media_kinds(sample: dict[str, Any]) -> list[str]:
    """The media types a sample's forward inputs carry (image, audio, video)."""
    return [kind for key, kind in MEDIA_INPUT_OF.items() if key in sample]
