"""Calibration inputs: train-split decision records rendered as the runner renders them, for the quantizers
(quantbench.models.quantize) and the synthetic shapes' one calibration forward (quantbench.models.synthetic).

The quantizers feed the model one batch at a time as keyword inputs (`model(**inputs)`): a text batch is
`input_ids` + `attention_mask` (calibration_inputs). A record carrying media (a Qwen3-Omni thinker's image, audio
or video) becomes the same kind of dict, made by the checkpoint's own processor: `input_ids` with the media
placeholders expanded, `attention_mask`, and the tower inputs the thinker's forward needs (`pixel_values` +
`image_grid_thw`, `input_features` + `feature_attention_mask`, `pixel_values_videos` + `video_grid_thw` +
`video_second_per_grid`), so the calibration forward runs the towers exactly as a decision does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantbench.errors import QuantbenchError
from quantbench.protocol.prompt import answer_text, render_prompt
from quantbench.protocol.suitegen import generate

if TYPE_CHECKING:  # only annotations: the parent imports the quantizers (run.resolve) without importing torch
    from torch import Tensor


def calibration_texts(tokenizer: Any, nsamples: int, seqlen: int, seed: int = 0) -> list[str]:
    """`nsamples` texts of at least `seqlen` tokens, each a run of train-split decision records rendered as the
    runner renders them (quantbench.protocol.prompt.render_prompt) followed by the gold answer, joined by blank lines.
    AutoRound drops texts shorter than seqlen, hence the packing."""
    texts: list[str] = []
    pool: list[str] = []
    rounds = 0
    while len(texts) < nsamples:
        parts, tokens = [], 0
        while tokens < seqlen + seqlen // 10 + 8:  # a margin: tokens merge differently across the joins
            if not pool:
                if rounds == 64:
                    raise QuantbenchError("calibration: the suite generator ran dry; ask for fewer or shorter samples")
                for rec in generate("train", max(64, nsamples * 4), seed=seed + rounds):
                    for name, question in rec.request.questions.items():
                        gold = (rec.gold or {}).get(name, question.options[0])
                        pool.append(render_prompt(tokenizer, rec.request, name) + answer_text(tokenizer, question, gold))
                pool.reverse()  # pop() from the end keeps the generator's order
                rounds += 1
            text = pool.pop()
            parts.append(text)
            tokens += len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 2  # + the blank line
        texts.append("\n\n".join(parts))
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
