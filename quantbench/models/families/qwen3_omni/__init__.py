"""The Qwen3-Omni-MoE family, run as its thinker: what it is and how it loads (family.py), how it reads media
(engine.py and media_batch.py: the decision engine; processor.py and pixels.py: the checkpoint's processor;
towers.py and decoder_graphs.py: the towers and the media decoder on a GPU; media_context.py: a request's context
from its parts' headers), and its real shape with random weights (synthetic.py)."""

from quantbench.models.families.qwen3_omni.family import Qwen3OmniThinkerFamily

__all__ = ["Qwen3OmniThinkerFamily"]
