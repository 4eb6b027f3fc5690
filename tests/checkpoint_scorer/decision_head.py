"""The joint decision head of the test checkpoint's scorer: one BF16 linear layer from the decoder's last hidden
state to a logit per option slot (a checkpoint ships this file beside decision_scorer.py)."""

import torch

OPTION_SLOTS = 8


class OptionHead(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, OPTION_SLOTS, dtype=torch.bfloat16)

    def forward(self, hidden: torch.Tensor, n_options: int) -> torch.Tensor:
        """Log-probabilities over the first `n_options` slots, computed in float32 from the BF16 logits."""
        logits = self.proj(hidden.to(torch.bfloat16))[..., :n_options].float()
        return torch.log_softmax(logits, dim=-1)
