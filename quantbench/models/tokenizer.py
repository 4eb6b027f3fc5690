"""The embedded tokenizer: a byte-level BPE trained, deterministically and in about 2 s, on the suite generator's
train split. The embedded default model (quantbench.make.fixture) is trained with it, and the synthetic real shapes
(quantbench.models.synthetic) are built with it at load time, so it lives with the readers: a `--shape` run's child
builds it without importing anything that makes models.

Its recipe (TOKENIZER, the text it is trained on: MIX) is part of the fixture's recipe hash.
"""

from __future__ import annotations

import functools
from typing import Any

LABEL_TOKENS = [" " + chr(ord("A") + i) for i in range(26)] + [" yes", " no"]
PAD, EOS = "<|pad|>", "<|endoftext|>"
CONTEXT = 1024  # tokens: the fixture's context (its max_position_embeddings), the tokenizer's model_max_length
TOKENIZER = {"vocab_size": 3000, "min_frequency": 2, "split_digits": True}  # trained on MIX
# train records per family: more for the families a tiny model learns slowly (number order, item facts); the
# fixture trains on the same records (quantbench.make.fixture.TRAIN["mix"])
MIX = {"intent": 300, "nli": 850, "compare": 2400, "tool": 300, "facts": 1100, "sentiment": 250, "multi": 600}


def _corpus(records: list[Any]) -> list[str]:
    from quantbench.protocol.prompt import answer_text, render_prompt
    from quantbench.protocol.suitegen import world_facts

    texts = []
    for rec in records:
        for name, question in rec.request.questions.items():
            texts.append(render_prompt(None, rec.request, name) + answer_text(None, question, rec.gold[name]))
    # Every label must be one token: give the trainer each of them often enough to merge.
    texts += ["".join(LABEL_TOKENS)] * 50 + world_facts()
    return texts


@functools.cache
def tokenizer_json() -> str:
    """Train the fixture's BPE once per process (about 2 s) and keep it as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from quantbench.protocol.suitegen import generate

    tok = Tokenizer(models.BPE())
    # One token per digit: comparing numbers digit by digit is learnable in a minute; 90 number tokens are not.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER["vocab_size"],
        min_frequency=TOKENIZER["min_frequency"],
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(generate("train", 0, seed=0, families=MIX)), trainer)
    for label in LABEL_TOKENS:
        if len(tok.encode(label, add_special_tokens=False).ids) != 1:
            raise RuntimeError(f"fixture tokenizer: label {label!r} is not one token; raise its count in _corpus")
    return tok.to_str()


def build_tokenizer():
    """The fixture's byte-level BPE tokenizer, trained on the generator's train split (deterministic), wrapped
    for transformers: pad and eos tokens, no chat template (the plain template of quantbench.protocol.prompt applies)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json()), pad_token=PAD, eos_token=EOS)
    fast.model_max_length = CONTEXT
    return fast
