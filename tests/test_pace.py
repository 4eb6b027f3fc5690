"""Long builds say how long they will take on this machine, from their own first steps, and when the machine is
busy (the embedded model was quoted at "about 2 minutes" and took 19-29 on a loaded 2-core VM)."""

from __future__ import annotations

from quantbench import term


def test_a_busy_machine_is_named_with_its_load_and_cores(monkeypatch):
    monkeypatch.setattr(term.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(term.os, "getloadavg", lambda: (6.2, 5.0, 4.0))
    assert term.load_note() == ("this machine is busy: load average 6.2 on 2 cores, so other work competes with "
                                "this step and it takes longer than on idle cores")
    monkeypatch.setattr(term.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert term.load_note() is None


def test_the_estimate_comes_from_the_measured_first_steps_once(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(term.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(term.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    said: list[str] = []
    pace = term.Pace("training the embedded model", 300, say=said.append)
    for step in range(1, 8):
        clock[0] += 2.0  # 2 s a step
        pace.update(step)
    assert said == ["training the embedded model: 2.00 s a step over the first 5 of 300 on this machine: about "
                    "9 min 50 s left, 10 min 00 s in all"]  # after 10 s, once


def test_durations_read_as_a_person_says_them():
    assert [term.fmt_duration(s) for s in (7, 104, 3725)] == ["7 s", "1 min 44 s", "1 h 02 min"]
