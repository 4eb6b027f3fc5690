"""Energy per decision (quantbench.run.energy): the reader's rules on a fake NVML counter, the child's timed phase
bracketed by it, and a CPU run storing NULL with its reason. CI has no GPU: the counter is a function here."""

import json

import pytest

from quantbench.run import energy as en
from quantbench.run.energy import EnergyMeter


class FakeGpu:
    """A wall clock that the meter's `sleep` and the test's `work` advance, and NVML's energy counter over it: mJ
    since load, at `watts`, updated only every `period_s` (as the real counter, ~20-100 ms)."""

    def __init__(self, watts: float = 400.0, idle_watts: float = 100.0, period_s: float = 0.05):
        self.t, self.mj, self.watts, self.idle_watts, self.period = 1000.0, 5_000_000.0, watts, idle_watts, period_s
        self.shown, self.next_update, self.syncs = int(self.mj), self.t + period_s, 0

    def _advance(self, seconds: float, watts: float) -> None:
        end = self.t + seconds
        while self.next_update <= end:
            self.mj += watts * (self.next_update - self.t)  # watts here in mW: mW · s = mJ
            self.t = self.next_update
            self.shown = int(self.mj)
            self.next_update += self.period
        self.mj += watts * (end - self.t)
        self.t = end

    def read_mj(self) -> int:
        return self.shown

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:  # idle
        self._advance(seconds, self.idle_watts * 1000)

    def work(self, seconds: float) -> None:  # decisions
        self._advance(seconds, self.watts * 1000)

    def synchronize(self) -> None:
        self.syncs += 1

    def meter(self, **kw) -> EnergyMeter:
        return EnergyMeter(self.read_mj, synchronize=self.synchronize, clock=self.clock, sleep=self.sleep, **kw)


def test_an_advancing_counter_gives_joules_per_decision_mean_watts_and_idle_power():
    gpu = FakeGpu(watts=400, idle_watts=100)
    meter = gpu.meter()
    meter.idle()
    meter.start()
    for i in range(300):  # 300 decisions of 20 ms: far below the counter's 50 ms resolution one by one
        gpu.work(0.02)
        meter.mark(i + 1)  # the child samples between decisions, at most every 0.1 s
    f = meter.stop(decisions=300, forward_s=5.4)
    assert f.energy_decisions == 300 and f.energy_phase_s == pytest.approx(6.0)
    # 400 W over 6 s = 2400 J, 8 J per decision, within one counter update (0.05 s x 400 W = 20 J) of the truth
    assert f.energy_j_per_decision == pytest.approx(8.0, abs=20 / 300)
    assert f.energy_mean_w == pytest.approx(400, abs=20 / 6)
    assert f.energy_idle_w == pytest.approx(100, abs=100 * 0.05 / 1.0)
    assert meter.note is None and gpu.syncs == 2 + len(meter.samples)  # a synchronize before every read
    assert 48 <= len(meter.samples) <= 62  # every 0.1 s or so (the first decision boundary after) of 6 s
    extra = meter.extra()
    assert "nvmlDeviceGetTotalEnergyConsumption" in extra["method"] and extra["joules"] == pytest.approx(2400, abs=20)
    assert extra["forward_share"] == pytest.approx(0.9)  # 5.4 s of the 6 s phase were timed forward passes


def test_a_counter_that_did_not_advance_stores_null_and_says_so():
    gpu = FakeGpu()
    meter = EnergyMeter(lambda: 123_456, clock=gpu.clock, sleep=gpu.sleep)
    meter.idle()
    meter.start()
    gpu.work(3.0)
    meter.mark(100)
    f = meter.stop(decisions=100)
    assert f.energy_j_per_decision is None and f.energy_mean_w is None and f.energy_idle_w is None
    assert "did not advance" in meter.note and "123456 -> 123456 mJ" in meter.note
    assert "idle power not measured" in meter.extra()["idle_note"]
    assert f.energy_phase_s == pytest.approx(3.0) and f.energy_decisions == 100  # the phase itself is a fact


def test_a_phase_shorter_than_the_minimum_stores_null_and_names_the_flag():
    gpu = FakeGpu()
    meter = gpu.meter()
    meter.start()
    for i in range(50):  # 1.5 s: the counter advanced, but too few updates to trust
        gpu.work((en.MIN_PHASE_S - 0.5) / 50)
        meter.mark(i + 1)
    f = meter.stop(decisions=50)
    assert f.energy_j_per_decision is None and f.energy_mean_w is None
    assert "did not settle over the 1.50 s phase" in meter.note and "joules" not in meter.extra()


def test_a_gpu_without_the_counter_stores_null_with_nvmls_reason(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def not_supported(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", not_supported)
    meter = EnergyMeter.for_run("cuda:0", 0, local=True, synchronize=lambda: None)
    meter.idle()
    meter.start()
    f = meter.stop(decisions=10)
    assert f == en.EnergyFigures()  # every column NULL
    assert meter.note.startswith("not measured: NVML has no total-energy counter")
    assert "Not Supported" in meter.note


def test_the_counter_is_read_through_nvml_for_the_runs_gpu(monkeypatch):
    pynvml = pytest.importorskip("pynvml")
    counter = iter(range(1_000_000, 10**9, 250_000))  # 250 J per read
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    seen = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", lambda h: seen.append(h) or next(counter))
    read, missing = en.nvml_counter(3)
    assert missing is None and read() == 1_250_000 and seen == [("handle", 3)] * 2  # a probe, then the read


@pytest.mark.parametrize(("device", "local", "why"), [
    ("cpu", True, "a CPU run"),
    ("cuda:0", False, "remote server"),
])
def test_no_counter_is_read_for_a_cpu_run_or_a_remote_server(device, local, why):
    meter = EnergyMeter.for_run(device, 0, local=local, synchronize=lambda: None)
    meter.idle()
    meter.start()
    assert meter.stop(decisions=10) == en.EnergyFigures()
    assert why in meter.note


def test_the_child_brackets_exactly_the_timed_decisions(tmp_path):
    """The child's `_answer_suite` reads the counter after the cold and warm-up decisions and after the last
    timed one: the decisions the meter divides by are the latency rows, the phase their time."""
    from quantbench.run import child
    from quantbench.run.record import Measured
    from quantbench.run.spec import RunSpec
    from tests.tiny import TinyBackend

    suite = tmp_path / "mini.jsonl"
    suite.write_text("".join(json.dumps({
        "id": f"r{i}", "benchmark": "mini",
        "request": {"state": {"observation": f"wall {i}"},
                    "questions": {"q": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}}},
    }) + "\n" for i in range(4)))
    spec = RunSpec(backend="tests.tiny:TinyBackend", suite=str(suite), gpu="cpu", warmup=2,
                   latency_min_decisions=9, latency_min_seconds=0.0)
    loaded = TinyBackend().load(spec, None)
    from quantbench.protocol.suite import load_suite

    records = load_suite(str(suite)).records
    calls = []

    class Probe(EnergyMeter):
        def idle(self):
            calls.append(("idle", len(out["latencies"]), forwards[0]))

        def start(self):
            calls.append(("start", len(out["latencies"]), forwards[0]))

        def stop(self, decisions, forward_s=None):
            calls.append(("stop", decisions, forwards[0]))
            assert forward_s == pytest.approx(sum(lat.model_ms for lat in out["latencies"]) / 1e3)
            return self.figures

    forwards = [0]
    forward = loaded.engine.forward

    def counted(prepared):
        forwards[0] += 1
        return forward(prepared)

    loaded.engine.forward = counted
    out = {"run": Measured(), "answers": [], "latencies": []}
    child._answer_suite(loaded, records, child.Timer("cpu"), spec, out, Probe(None))
    n = len(out["latencies"])
    assert n == 9  # the suite's 4 and 5 latency repeats
    # idle and start after the cold decision and 2 warm-ups; stop after every timed one, with their count
    assert calls == [("idle", 0, 3), ("start", 0, 3), ("stop", n, 3 + n)]



def test_energy_counts_only_the_window_where_power_has_settled():
    """Clocks ramp up over the first 2 s (100 → 250 W), then hold 400 W: the whole phase would say less than 7 J a
    decision, the settled window 8 J (400 W × 20 ms), and the child keeps timing until that window is 2 s long."""
    gpu = FakeGpu(watts=100, period_s=0.05)
    meter = gpu.meter()
    meter.start()
    decisions, wanted = 0, []
    for watts in (100, 150, 200, 250):  # 0.5 s each
        gpu.watts = watts
        for _ in range(25):
            gpu.work(0.02)
            decisions += 1
            meter.mark(decisions)
        wanted.append(meter.needs_more())
    gpu.watts = 400
    while meter.needs_more():
        gpu.work(0.02)
        decisions += 1
        meter.mark(decisions)
    assert all(wanted)  # no settled window yet while the clocks ramp
    f = meter.stop(decisions=decisions)
    w = meter.window
    assert w.start_s >= 1.9 and w.seconds >= en.MIN_PHASE_S  # the ramp is left out, and what is left is long enough
    assert f.energy_j_per_decision == pytest.approx(8.0, rel=0.03)
    assert f.energy_mean_w == pytest.approx(400, rel=0.03)
    whole = (gpu.shown - meter.samples[0][1]) / 1e3 / decisions
    assert whole < 7.0  # what the whole phase would have said
    assert f.energy_decisions == w.decisions < decisions
    assert meter.extra()["window"]["settled_from_segment"] >= 2


def test_a_power_that_never_settles_stores_null_and_says_so():
    gpu = FakeGpu(watts=100, period_s=0.05)
    meter = gpu.meter(max_phase_s=6.0)
    meter.start()
    decisions = 0
    while meter.needs_more():  # power climbing 28% a second: every window drifts by more than 10%
        gpu.watts *= 1.005
        gpu.work(0.02)
        decisions += 1
        meter.mark(decisions)
    f = meter.stop(decisions=decisions)
    assert 5.9 <= meter.phase_s <= 6.2  # the phase stopped at max_phase_s
    assert f.energy_j_per_decision is None and ("did not settle" in meter.note or "settled for" in meter.note)


def test_a_settled_window_of_exactly_the_minimum_is_measured():
    # The rule is "at least MIN_PHASE_S": a window of exactly 2 s is enough, and the phase stops extending there.
    # A hand-driven clock and counter: 1 s at 100 W (the clocks ramping), then 2 s at 400 W, sampled every 0.5 s.
    now, mj = [0.0], [0]
    meter = EnergyMeter(lambda: mj[0], clock=lambda: now[0], sleep=lambda s: None)
    meter.start()
    decisions = 0
    for t, watts in ((0.5, 100), (1.0, 100), (1.5, 400), (2.0, 400), (2.5, 400), (3.0, 400)):
        mj[0] += int(watts * 0.5 * 1000)
        now[0] = t
        decisions += 10
        meter.mark(decisions)
    assert en.MIN_PHASE_S == 2.0
    assert en.settled_window(meter.samples).seconds == en.MIN_PHASE_S  # from 1.0 s to 3.0 s exactly
    assert not meter.needs_more()
    f = meter.stop(decisions=decisions)
    assert meter.note is None and f.energy_phase_s == en.MIN_PHASE_S and f.energy_decisions == 40
    assert f.energy_j_per_decision == pytest.approx(800 / 40) and f.energy_mean_w == pytest.approx(400)
