"""A scorer shipped with a checkpoint, written for quantbench's tests of the contract (README, "A checkpoint's own
scorer"): one forward pass of the loaded model over every question of a request (right-padded rows), the last
prompt token's hidden state of each row through the checkpoint's own BF16 head (decision_head.py, its weights in
decision_head.safetensors), a probability per option. It imports nothing from quantbench, as a real checkpoint's
code would not."""

import json

import torch

from .decision_head import OptionHead


def options_of(question: dict) -> list[str]:
    return list(question["criteria"]) if question["type"] == "choice" else ["yes", "no"]


class TinyScorer:
    def __init__(self, *, model, tokenizer, processor, checkpoint, device, weights):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.head = OptionHead(weights["proj.weight"].shape[1]).to(device)
        self.head.load_state_dict(weights, strict=True)  # every head tensor, nothing else: or it raises

    def prepare(self, request: dict) -> dict:
        """Tokenizing: untimed, as quantbench's own engine tokenizes apart from the forward pass."""
        state = json.dumps(request["state"], sort_keys=True)
        rows, options = [], {}
        for name, question in request["questions"].items():
            options[name] = options_of(question)
            text = f"State: {state}\nQuestion: {name} {' '.join(options[name])}\nAnswer:"
            rows.append(self.tokenizer(text)["input_ids"])
        return {"rows": rows, "options": options}

    def tokens(self, prepared: dict) -> int:
        return sum(len(r) for r in prepared["rows"])

    def score(self, prepared: dict) -> dict[str, dict[str, float]]:
        rows = prepared["rows"]
        ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        hidden = self.model.model(input_ids=ids.to(self.device)).last_hidden_state
        last = hidden[torch.arange(len(rows)), torch.tensor([len(r) - 1 for r in rows])]
        out = {}
        for i, (name, options) in enumerate(prepared["options"].items()):
            probs = self.head(last[i], len(options)).exp()
            out[name] = {option: float(p) for option, p in zip(options, probs, strict=True)}
        return out


class UnnormalisedScorer(TinyScorer):
    """A scorer with a bug: it returns each option's sigmoid, which does not sum to 1."""

    def score(self, prepared: dict) -> dict[str, dict[str, float]]:
        right = super().score(prepared)
        return {name: {o: float(torch.sigmoid(torch.tensor(p * 10))) for o, p in probs.items()}
                for name, probs in right.items()}
