"""`serve`'s warm-up on a GPU captures every batch size at the demo request's width and at each --warm-tokens width
(quantbench.server.warm.warm_up), so that no client's first 512-token request of a new batch size waits for a
capture: on the H200 those captures were the p99 of 8 clients (1,560 ms against a p50 of 89, 2026-12-03)."""

from __future__ import annotations

from types import SimpleNamespace

from quantbench.engine.scoring import Prepared
from quantbench.protocol import is_media_part, parse_request
from quantbench.server.endpoint import ServerState
from quantbench.server.warm import demo_picture_request, warm_prepared, warm_up


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


class PictureEngine(ShapeEngine):
    """A ShapeEngine whose model reads pictures: a request with one has 200 more tokens a row."""

    modalities = frozenset({"image"})

    def prepare(self, request):
        extra = 200 if any(is_media_part(v) for v in request.state.values()) else 0
        return Prepared(request=request, rows=[[5] * (40 + extra), [6] * (43 + extra)], readers=[], media=None)


def test_on_a_gpu_every_batch_size_is_warmed_at_the_demo_width_and_each_warm_width():
    engine = ShapeEngine("cuda:0")
    done = warm_up(SimpleNamespace(engine=engine), ServerState(), 4, (512, 1024, 16))
    assert engine.warmed == [(2, 43), (4, 43), (8, 43), (2, 512), (4, 512), (8, 512), (2, 1024), (4, 1024), (8, 1024)]
    assert engine.answered == engine.warmed and done == 9  # a width under the demo's own (16) adds nothing


def test_on_a_cpu_the_warm_up_is_one_pass_at_the_demo_width():
    engine = ShapeEngine("cpu")
    assert warm_up(SimpleNamespace(engine=engine), ServerState(), 16, (512,)) == 1
    assert engine.warmed == [(2, 43)]


def test_a_padded_warm_shape_pads_each_row_with_the_pad_id_and_leaves_the_original_alone():
    prepared = Prepared(request=None, rows=[[5] * 40, [6] * 43], readers=[], media=None)
    plain, wide = warm_prepared(prepared, (512,), 7)
    assert plain is prepared and [len(r) for r in prepared.rows] == [40, 43]
    assert [len(r) for r in wide.rows] == [512, 512] and wide.rows[0][40:] == [7] * 472


def test_a_model_that_reads_pictures_is_also_warmed_with_a_picture_at_each_width_plus_the_pictures_tokens():
    """The media decoder's buckets: on the H200 the Qwen3-Omni thinker's [2|4|8, 736] buckets (512-token texts with
    a 448 x 448 picture) were captured under load, p99 3,150 ms against a p50 of 136."""
    engine = PictureEngine("cuda:0")
    done = warm_up(SimpleNamespace(engine=engine), ServerState(), 2, (512,))
    assert engine.warmed == [(2, 43), (4, 43), (2, 512), (4, 512), (2, 243), (4, 243), (2, 712), (4, 712)]
    assert done == 8
    cpu = PictureEngine("cpu")
    assert warm_up(SimpleNamespace(engine=cpu), ServerState(), 2, (512,)) == 1 and cpu.warmed == [(2, 43)]


def test_the_demo_picture_is_a_valid_request_with_a_448_square_png():
    request = parse_request(demo_picture_request())
    [part] = [v for v in request.state.values() if is_media_part(v)]
    assert part["type"] == "image" and part["data"].startswith("data:image/png;base64,")
    from quantbench.limits import Limits
    from quantbench.protocol.media import decode_part

    decoded = decode_part("camera", part, Limits())
    assert decoded.image.size == (448, 448)
