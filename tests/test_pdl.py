"""quantbench.engine.pdl: when kernels launch early, and that a launch gets the wait with the attribute (never alone)."""

import torch

from quantbench.engine import pdl


def test_off_on_cpus_and_under_the_interpreter(monkeypatch):
    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setattr(pdl, "_capable", lambda index: True)  # as on an sm_90 GPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(pdl.ENV, raising=False)
    cuda = torch.device("cuda", 0)
    assert pdl.enabled(cuda)
    assert pdl.launch_args(cuda) == {"PDL": True, "launch_pdl": True}  # the kernel's wait and the attribute together
    monkeypatch.setenv(pdl.ENV, "0")
    assert pdl.launch_args(cuda) == {"PDL": False}
    monkeypatch.setenv(pdl.ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs no inline PTX: the kernels compile without
    assert pdl.launch_args(cuda) == {"PDL": False}


def test_gpus_before_hopper_launch_as_before(monkeypatch):
    monkeypatch.setattr(pdl, "_capable", lambda index: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl.launch_args(torch.device("cuda", 0)) == {"PDL": False}
