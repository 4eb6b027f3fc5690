"""The shared scoring engine: one forward per request, order-independent answers, honest methods."""

import pytest
import torch

from quantbench.engine.scoring import TransformersEngine
from quantbench.errors import ContextLengthError
from quantbench.protocol import parse_request
from tests.tiny import tiny_model, tiny_tokenizer

REQUEST = {
    "state": {"observation": "The player is facing a wall.", "hp": 7},
    "questions": {
        "action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right", "forward": "Move forward"}},
        "safe": {"type": "boolean", "description": "Is the player safe?"},
        "dir": {"type": "choice", "criteria": {"alpha": "first", "beta": "second"}},
    },
}


@pytest.fixture(scope="module")
def engine():
    return TransformersEngine(tiny_model(), tiny_tokenizer())


def answers(engine, data):
    return engine.forward(engine.prepare(parse_request(data)))


def test_probabilities_sum_to_one_and_top_is_argmax(engine):
    for ans in answers(engine, REQUEST).values():
        assert abs(sum(ans.probabilities.values()) - 1) < 1e-9
        assert ans.top == max(ans.probabilities, key=ans.probabilities.get)
        assert ans.method == "label_logit"


def test_reordering_questions_changes_no_probability(engine):
    a = answers(engine, REQUEST)
    reordered = dict(REQUEST, questions=dict(reversed(list(REQUEST["questions"].items()))))
    b = answers(engine, reordered)
    alone = {name: answers(engine, dict(REQUEST, questions={name: qq}))[name] for name, qq in REQUEST["questions"].items()}
    for name in a:
        for opt, p in a[name].probabilities.items():
            assert abs(p - b[name].probabilities[opt]) < 1e-4
            assert abs(p - alone[name].probabilities[opt]) < 1e-4


def test_one_forward_pass_per_request(engine, monkeypatch):
    calls = []
    decoder = engine.model.get_decoder()
    original = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    answers(engine, REQUEST)
    assert len(calls) == 1


def test_more_options_than_labels_falls_back_to_continuation(engine):
    many = {"state": {"x": 1}, "questions": {"q": {"type": "choice", "criteria": {f"o{i}": "opt" for i in range(30)}}}}
    engine.max_options = 30
    ans = engine.forward(engine.prepare(parse_request(many, max_options=30)))["q"]
    assert ans.method == "continuation"
    assert len(ans.probabilities) == 30 and abs(sum(ans.probabilities.values()) - 1) < 1e-9


def test_label_logit_equals_continuation_for_single_token_labels():
    """With one-token options the two methods read the same logits, so they must agree."""
    tok = tiny_tokenizer()
    model = tiny_model()
    data = {"state": {"x": "wall"}, "questions": {"q": {"type": "boolean"}}}
    a = TransformersEngine(model, tok).forward(TransformersEngine(model, tok).prepare(parse_request(data)))["q"]
    e = TransformersEngine(model, tok, method="continuation")
    b = e.forward(e.prepare(parse_request(data)))["q"]
    assert b.method == "continuation"
    assert a.probabilities["yes"] == pytest.approx(b.probabilities["yes"], abs=1e-5)


def test_batching_requests_gives_the_same_answers(engine):
    r1, r2 = parse_request(REQUEST), parse_request(dict(REQUEST, state={"observation": "Open field"}))
    together = engine.forward_many([engine.prepare(r1), engine.prepare(r2)])
    for alone, batched in zip([engine.forward(engine.prepare(r1)), engine.forward(engine.prepare(r2))], together, strict=True):
        for name in alone:
            for opt, p in alone[name].probabilities.items():
                assert abs(p - batched[name].probabilities[opt]) < 1e-4


def test_prompt_over_the_context_is_refused_or_truncated_when_asked():
    long = {"state": {"text": "wall " * 400}, "questions": {"q": {"type": "boolean"}}}
    strict = TransformersEngine(tiny_model(), tiny_tokenizer(), max_tokens=64)
    with pytest.raises(ContextLengthError, match="over the model's limit of 64"):
        strict.prepare(parse_request(long))
    lenient = TransformersEngine(tiny_model(), tiny_tokenizer(), max_tokens=64, truncate=True)
    prepared = lenient.prepare(parse_request(long))
    assert max(len(r) for r in prepared.rows) <= 64
    ans = lenient.forward(prepared)["q"]
    assert ans.truncated is True


def test_bf16_model_scores_without_error():
    e = TransformersEngine(tiny_model(dtype=torch.bfloat16), tiny_tokenizer())
    ans = answers(e, REQUEST)
    assert set(ans) == set(REQUEST["questions"])


def test_label_answers_read_only_the_label_rows_of_the_head_and_match_the_whole_head(engine, monkeypatch):
    """Label logits come from the head's rows for the labels alone (one small GEMM, not the whole vocabulary), and
    equal what the whole head gives; a head that is not a plain Linear runs whole."""
    head = engine.model.get_output_embeddings()
    whole_calls = []
    original = type(head).forward
    monkeypatch.setattr(type(head), "forward",
                        lambda self, x: (self is head and whole_calls.append(x.shape)) or original(self, x))
    rows = answers(engine, REQUEST)
    assert whole_calls == []  # the head's forward never ran over the vocabulary
    monkeypatch.setattr(engine, "_label_columns", lambda batch: None)  # the whole-head path, as before
    whole = answers(engine, REQUEST)
    assert len(whole_calls) == 1
    for name, ans in rows.items():
        assert ans.top == whole[name].top
        for opt, p in ans.probabilities.items():
            assert p == pytest.approx(whole[name].probabilities[opt], abs=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(head, "forward", lambda x: original(head, x))  # a wrapped head (accelerate's hooks do this)
    assert engine._label_columns([engine.prepare(parse_request(REQUEST))]) is None


def test_graphs_are_captured_under_inference_mode_as_the_forward_runs(engine, monkeypatch):
    """warm() captures a bucket's CUDA graph before it is timed; with autograd on, the fused q/k/v and decoder-layer
    forwards step aside and the graph would record the unfused ops."""
    seen = []
    monkeypatch.setattr(engine.decoder, "ensure",
                        lambda rows, width, device: seen.append((torch.is_inference_mode_enabled(),
                                                                 torch.is_grad_enabled())))
    engine.warm([engine.prepare(parse_request(REQUEST))])
    assert seen == [(True, False)]


def test_the_direct_rust_tokenizer_gives_the_wrappers_ids_and_steps_aside_when_they_differ():
    """_encode calls the Rust tokenizer behind a fast one directly (no wrapper, no offsets); its first calls are
    checked against transformers' call, and a tokenizer whose Python side changes the text loses the direct path."""
    from quantbench.engine.scoring import TransformersEngine
    from quantbench.make.fixture import build_tokenizer
    from tests.tiny import tiny_model

    tok = build_tokenizer()
    engine = TransformersEngine(tiny_model(), tok)
    texts = ["State:\nkey: value 123 — naïve café\n" * 20, " left", "<|endoftext|> x", "a  \n\n b\t7.5"]
    assert engine._rust is not None
    for text in texts:
        for special in (False, True):
            assert engine._encode(text, special) == tok(text, add_special_tokens=special)["input_ids"]
    assert engine._rust is not None  # every check agreed

    class Lowering(type(tok)):
        def __call__(self, text, **kw):  # a tokenizer class that changes the text in Python
            return super().__call__(text.lower(), **kw)

    lowering = Lowering.__new__(Lowering)
    lowering.__dict__.update(tok.__dict__)
    engine = TransformersEngine(tiny_model(), lowering)
    assert engine._encode("LEFT and RIGHT " * 20, False) == lowering("LEFT and RIGHT " * 20)["input_ids"]
    assert engine._rust is None  # the direct path stepped aside at the first difference
