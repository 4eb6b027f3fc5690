"""Training the omni default model (quantbench.make.omni_fixture): examples made by the engine that will score
the model, and the training loop.

Every example is one question of a decision record prepared by `OmniEngine.prepare` itself (the prompt's token
ids with each media part's placeholder expanded, and the processor's pixel values, audio features and grids), so
the model learns exactly what it is later asked. The decoder and head come trained from the text fixture and stay
frozen (the text families keep the text fixture's answers exactly); only the vision and audio towers train, from
scratch, on media records, on the loss of the gold label among the question's option labels (what a decision
scores): gradients flow back through the frozen decoder into the towers, which learn to feed it what it needs to
pick the gold label. The vision tower trains at its own, lower learning rate: at the audio tower's it swings to
answering one label with confidence whatever the picture (measured: 2 of 3 short runs at chance on every
vision family). Each batch's media inputs are joined as the engine joins them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

VISION, AUDIO = "model.visual.", "model.audio_tower."  # parameter names of the vision and audio towers
TOWERS = (VISION, AUDIO)


@dataclass
class Example:
    ids: list[int]  # the prompt's token ids (media placeholders expanded)
    answer: int  # the gold label's token id
    media: dict[str, Any]  # the processor's tensors for this prompt
    labels: list[int]  # the token ids of the question's option labels (the gold one among them)


def record_examples(engine: Any, records: list[Any]) -> list[Example]:
    """One Example per question of each record, prepared by `engine` (an OmniEngine over the model in training)."""
    out = []
    for rec in records:
        prepared = engine.prepare(rec.request)
        for reader in prepared.readers:
            if reader.label_ids is None or prepared.media is None:
                raise RuntimeError(f"{rec.id}: question {reader.question!r} has no medium or no single-token labels "
                                   "to train the towers on")
            row = reader.rows[0]
            answer = reader.label_ids[reader.options.index(rec.gold[reader.question])]
            out.append(Example(prepared.rows[row], answer, prepared.media[row], list(reader.label_ids)))
    return out


def _batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, answer positions, option label ids, gold option index) of a right-padded batch of
    prompts; questions with fewer options repeat their first label (masked out of the loss by `_option_loss`)."""
    width = max(len(ex.ids) for ex in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, ex in enumerate(examples):
        ids[i, : len(ex.ids)] = torch.tensor(ex.ids)
        mask[i, : len(ex.ids)] = 1
    positions = torch.tensor([len(ex.ids) - 1 for ex in examples])
    width = max(len(ex.labels) for ex in examples)
    labels = torch.tensor([ex.labels + ex.labels[:1] * (width - len(ex.labels)) for ex in examples])
    gold = torch.tensor([ex.labels.index(ex.answer) for ex in examples])
    return ids, mask, positions, labels, gold


def _option_loss(logits: torch.Tensor, labels: torch.Tensor, gold: torch.Tensor, examples: list[Example]) -> torch.Tensor:
    """Cross-entropy of the gold label among each question's own option labels (the padding repeats masked)."""
    picked = logits.gather(1, labels)
    width = labels.shape[1]
    padding = torch.tensor([[0.0] * len(ex.labels) + [float("-inf")] * (width - len(ex.labels)) for ex in examples])
    return torch.nn.functional.cross_entropy(picked + padding, gold)


def train(model: Any, examples: list[Example], pad_id: int, train: dict[str, Any], *, seed: int, steps: int,
          progress: bool) -> float:
    """Train `model` (a Qwen3-Omni thinker, float32) in place on shuffled batches of `examples`; the last answer loss."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from quantbench.make.fixture import _batches
    from quantbench.models.families.qwen3_omni.media_batch import join_media
    from quantbench.term import LineProgress, Pace

    vision, audio = [], []
    for name, p in model.named_parameters():  # the towers train; the decoder and head keep the text fixture's
        p.requires_grad_(name.startswith(TOWERS))
        if p.requires_grad:
            (vision if name.startswith(VISION) else audio).append(p)
    trained = vision + audio
    opt = torch.optim.AdamW([{"params": vision, "lr": train["vision_lr"]}, {"params": audio, "lr": train["tower_lr"]}],
                            weight_decay=train["weight_decay"], betas=(0.9, 0.95))
    warmup = train["warmup"]

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batches = _batches(examples, random.Random(seed), train["batch_size"])
    loss_value = float("nan")
    bar = LineProgress(TextColumn("training omni fixture"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=Console(stderr=True),
                       disable=not progress, transient=False)
    pace = Pace("training the omni model", steps) if progress else None
    model.train()
    with bar:
        task = bar.add_task("train", total=steps, loss="-")
        for step in range(steps):
            batch = next(batches)
            ids, mask, positions, labels, gold = _batch(batch, pad_id)
            media = join_media([ex.media for ex in batch], torch.device("cpu"), torch.float32)
            out = model.model(input_ids=ids, attention_mask=mask, use_cache=False, **media)
            rows = torch.arange(len(batch))
            logits = model.lm_head(out.last_hidden_state[rows, positions]).float()
            loss = _option_loss(logits, labels, gold, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            sched.step()
            loss_value = loss.item()
            bar.update(task, advance=1, loss=f"{loss_value:.3f}")
            if pace is not None:
                pace.update(step + 1)
    model.eval()
    return loss_value
