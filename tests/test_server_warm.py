"""`serve`'s warm-up on a GPU captures every batch size at the demo request's width and at each --warm-tokens width
(quantbench.server.app._warm_up), so that no client's first 512-token request of a new batch size waits for a
capture: on the H200 those captures were the p99 of 8 clients (1,560 ms against a p50 of 89, 2026-12-03)."""

from __future__ import annotations

from types import SimpleNamespace

from quantbench.engine.scoring import Prepared
from quantbench.server.app import _warm_up, warm_prepared
from quantbench.server.endpoint import ServerState


class ShapeEngine:
    """An engine that records the [rows, width] of every batch it is asked to warm and answer."""

    def __init__(self, device: str):
        self.device, self.pad_id = device, 0
        self.warmed: list[tuple[int, int]] = []
        self.answered: list[tuple[int, int]] = []

    def prepare(self, request):
        return Prepared(request=request, rows=[[5] * 40, [6] * 43], readers=[], media=None)

    @staticmethod
    def _shape(batch):
        rows = [r for p in batch for r in p.rows]
        return len(rows), max(len(r) for r in rows)

    def warm(self, batch):
        self.warmed.append(self._shape(batch))

    def forward_many(self, batch):
        self.answered.append(self._shape(batch))
        return [{} for _ in batch]

    def synchronize(self):
        pass


def test_on_a_gpu_every_batch_size_is_warmed_at_the_demo_width_and_each_warm_width():
    engine = ShapeEngine("cuda:0")
    done = _warm_up(SimpleNamespace(engine=engine), ServerState(), 4, (512, 1024, 16))
    assert engine.warmed == [(2, 43), (4, 43), (8, 43), (2, 512), (4, 512), (8, 512), (2, 1024), (4, 1024), (8, 1024)]
    assert engine.answered == engine.warmed and done == 9  # a width under the demo's own (16) adds nothing


def test_on_a_cpu_the_warm_up_is_one_pass_at_the_demo_width():
    engine = ShapeEngine("cpu")
    assert _warm_up(SimpleNamespace(engine=engine), ServerState(), 16, (512,)) == 1
    assert engine.warmed == [(2, 43)]


def test_a_padded_warm_shape_pads_each_row_with_the_pad_id_and_leaves_the_original_alone():
    prepared = Prepared(request=None, rows=[[5] * 40, [6] * 43], readers=[], media=None)
    plain, wide = warm_prepared(prepared, (512,), 7)
    assert plain is prepared and [len(r) for r in prepared.rows] == [40, 43]
    assert [len(r) for r in wide.rows] == [512, 512] and wide.rows[0][40:] == [7] * 472
