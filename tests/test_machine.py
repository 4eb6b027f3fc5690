"""--gpu is checked against the hardware: a mismatch is refused, never a mislabelled row."""

import pytest

from quantbench.errors import GpuMismatchError
from quantbench.run.machine import Machine, check_gpu, detect, family_of

HOST = dict(host="h", cpu_model="cpu", host_memory_bytes=1, os="Linux", python_version="3.11")
H200 = Machine(device="cuda:0", gpu_name="NVIDIA H200", gpu_family="hopper", gpu_uuid="GPU-1", gpu_cc="9.0",
               gpu_sm_count=132, gpu_memory_bytes=1, driver_version="580", cuda_version="13.0", **HOST)
CPU = Machine(device="cpu", gpu_name=None, gpu_family="cpu", gpu_uuid=None, gpu_cc=None, gpu_sm_count=None,
              gpu_memory_bytes=None, driver_version=None, cuda_version=None, **HOST)


@pytest.mark.parametrize("cc, family", [((8, 0), "ampere"), ((8, 9), "ada"), ((9, 0), "hopper"),
                                        ((10, 0), "blackwell"), ((12, 0), "blackwell"), (None, "cpu")])
def test_compute_capability_names_the_family(cc, family):
    assert family_of(cc) == family


def test_matching_requests_pick_the_gpu():
    assert check_gpu("auto", H200) == "cuda:0"
    assert check_gpu("hopper", H200) == "cuda:0"
    assert check_gpu("H200", H200) == "cuda:0"
    assert check_gpu("cpu", H200) == "cpu"


def test_wrong_family_is_refused_with_what_is_here():
    with pytest.raises(GpuMismatchError, match="NVIDIA H200 \\(hopper.*--gpu hopper"):
        check_gpu("blackwell", H200)


def test_wrong_name_is_refused():
    with pytest.raises(GpuMismatchError, match="not the GPU here"):
        check_gpu("rtx pro 6000", H200)


def test_a_gpu_request_on_a_cpu_host_is_refused():
    with pytest.raises(GpuMismatchError, match="no GPU"):
        check_gpu("blackwell", CPU)
    assert check_gpu("auto", CPU) == "cpu"


def test_this_machine_is_detected():
    m = detect()
    assert m.host and m.host_memory_bytes > 0
    assert (m.gpu_name is None) == (m.device == "cpu")
    if not m.has_gpu:
        assert m.gpu_memory_bytes is None and m.gpu_family == "cpu"  # NULL, never 0
