"""Lesson 11 helpers: EnergyMeter on a fake RAPL tree and a fake pynvml, and the cost formulas."""
import sys
import time
import types

import pytest
import torch

from mgpu_utils.measure import energy
from mgpu_utils.measure.energy import EnergyMeter, energy_cost, energy_kwh, joules_per_sample, rapl_zones, run_cost

RANGE_UJ = 262_143_328_850                        # a real max_energy_range_uj (about 262 kJ)


@pytest.fixture
def powercap(tmp_path):
    """Two packages and a core sub-zone of package 0, as /sys/class/powercap shows them."""
    root = tmp_path / "powercap"
    for zone, name, uj in [("intel-rapl:0", "package-0", 1_000_000), ("intel-rapl:0:0", "core", 500_000),
                           ("intel-rapl:1", "package-1", 7_000_000)]:
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text(f"{uj}\n")
        (root / zone / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
    return root


def set_uj(root, zone, uj):
    (root / zone / "energy_uj").write_text(f"{uj}\n")


@pytest.fixture
def no_nvml(monkeypatch):
    """pynvml not importable, whatever this machine has installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


class FakeNVMLError(Exception):
    pass


@pytest.fixture
def fake_nvml(monkeypatch):
    """A pynvml with two GPUs whose counters (millijoules) the test moves; it counts open inits."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.mj = [10_000_000, 20_000_000]
    nv.open = 0
    nv.broken = None                              # None, "init" or "energy"

    def init():
        if nv.broken == "init":
            raise FakeNVMLError("Driver Not Loaded")
        nv.open += 1

    def shutdown():
        assert nv.open > 0, "nvmlShutdown without nvmlInit"
        nv.open -= 1

    def handle(i):
        assert nv.open > 0, "NVML used before nvmlInit"
        if not 0 <= i < len(nv.mj):
            raise FakeNVMLError("Invalid Argument")
        return ("handle", i)

    def total_energy(h):
        if nv.broken == "energy":
            raise FakeNVMLError("Not Supported")
        return nv.mj[h[1]]

    nv.nvmlInit, nv.nvmlShutdown = init, shutdown
    nv.nvmlDeviceGetCount = lambda: len(nv.mj)
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetHandleByUUID = lambda u: handle({"GPU-aaaa": 0, "GPU-bbbb": 1}.get(u, -1))
    nv.nvmlDeviceGetTotalEnergyConsumption = total_energy
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)      # every GPU, unless a test hides some
    monkeypatch.setattr(energy, "MIN_NVML_WINDOW_S", 0.0)           # the tests' windows are instants
    return nv


def test_rapl_zones_lists_packages_not_subzones(powercap):
    zones = rapl_zones(str(powercap))
    assert [z["name"] for z in zones] == ["package-0", "package-1"]
    assert zones[0]["path"] == str(powercap / "intel-rapl:0") and all(z["readable"] for z in zones)
    assert rapl_zones(str(powercap / "missing")) == []


def test_meter_sums_packages_once(powercap, no_nvml):
    m = EnergyMeter(powercap_root=str(powercap))             # auto, no NVML: RAPL
    assert m.available and m.source == "rapl" and m.reason == ""
    m.start()
    set_uj(powercap, "intel-rapl:0", 3_000_000)              # +2 J
    set_uj(powercap, "intel-rapl:0:0", 1_500_000)            # +1 J inside package 0: not added again
    set_uj(powercap, "intel-rapl:1", 7_500_000)              # +0.5 J
    time.sleep(0.01)
    assert m.stop() == pytest.approx(2.5) and m.joules == pytest.approx(2.5)
    assert m.seconds >= 0.01 and m.watts == pytest.approx(2.5 / m.seconds)   # by construction: slept 0.01 s


def test_meter_corrects_one_wrap_around(powercap):
    set_uj(powercap, "intel-rapl:0", RANGE_UJ - 1_000_000)
    with EnergyMeter("rapl", powercap_root=str(powercap)) as m:
        set_uj(powercap, "intel-rapl:0", 2_000_000)          # wrapped: 1 J before the wrap + 2 J after
    assert m.joules == pytest.approx(3.0)


def test_psys_platform_zone_is_not_added_to_the_packages(powercap):
    set_uj(powercap, "intel-rapl:1", 0)
    (powercap / "intel-rapl:1" / "name").write_text("psys\n")
    with EnergyMeter("rapl", powercap_root=str(powercap)) as m:
        set_uj(powercap, "intel-rapl:0", 2_000_000)
        set_uj(powercap, "intel-rapl:1", 5_000_000)
    assert m.joules == pytest.approx(1.0)


def test_unreadable_counters_are_unavailable_with_the_fix(powercap, monkeypatch, no_nvml):
    real = energy._read_int

    def root_only(path):
        if path.endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(energy, "_read_int", root_only)
    assert [z["readable"] for z in rapl_zones(str(powercap))] == [False, False]
    m = EnergyMeter(powercap_root=str(powercap))
    assert not m.available and m.source is None
    assert "not readable" in m.reason and "Permission denied" in m.reason
    assert f"sudo chmod o+r {powercap}/intel-rapl:*/energy_uj" in m.reason and "\n" not in m.reason
    m.start()
    assert m.stop() is None and m.joules is None and m.watts is None and m.seconds > 0


def test_no_counters_is_a_normal_state_with_a_visible_reason(tmp_path, no_nvml):
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "empty", tmp_path / "missing"):
        m = EnergyMeter(powercap_root=str(root))
        assert not m.available and m.source is None
        assert m.reason == (f"energy not available on this machine: no readable Linux RAPL counters under {root} "
                            f"and no NVIDIA GPU (NVML: pynvml is not installed: pip install nvidia-ml-py)")
        with m:
            time.sleep(0.01)
        assert m.joules is None and m.seconds >= 0.01           # by construction: slept 0.01 s
    forced = EnergyMeter("nvml", powercap_root=str(tmp_path / "empty"))
    assert not forced.available and "pip install nvidia-ml-py" in forced.reason and "RAPL" not in forced.reason


def test_nvml_sums_gpus_in_joules_and_is_preferred(powercap, fake_nvml):
    m = EnergyMeter(powercap_root=str(powercap))             # both present: auto takes the GPUs
    assert m.available and m.source == "nvml" and fake_nvml.open == 0
    m.start()
    assert fake_nvml.open == 1                               # held open while measuring
    fake_nvml.mj[0] += 1500
    fake_nvml.mj[1] += 500
    set_uj(powercap, "intel-rapl:0", 9_000_000)              # the CPU is not what NVML measures
    assert m.stop() == pytest.approx(2.0) and fake_nvml.open == 0
    one = EnergyMeter("nvml", gpus=[1])
    with one:
        fake_nvml.mj[0] += 4000
        fake_nvml.mj[1] += 250
    assert one.joules == pytest.approx(0.25)
    by_uuid = EnergyMeter("nvml", gpus=["bbbb"])              # torch's uuid has no "GPU-" prefix
    with by_uuid:
        fake_nvml.mj[1] += 750
    assert by_uuid.joules == pytest.approx(0.75)
    assert not EnergyMeter("nvml", gpus=["cccc"]).available   # an unknown GPU: said, not raised


def test_nvml_errors_make_it_unavailable_or_fall_back(powercap, fake_nvml):
    fake_nvml.broken = "energy"                              # a pre-Volta GPU
    m = EnergyMeter("nvml")
    assert not m.available and "Not Supported" in m.reason and "Volta" in m.reason and fake_nvml.open == 0
    assert EnergyMeter(powercap_root=str(powercap)).source == "rapl"
    fake_nvml.broken = "init"                                # pynvml installed, no driver
    m = EnergyMeter("nvml")
    assert not m.available and "no NVIDIA GPU (NVML: Driver Not Loaded)" in m.reason
    fake_nvml.broken = None
    m = EnergyMeter("nvml", gpus=[5])                        # no such GPU
    assert not m.available and "Invalid Argument" in m.reason and fake_nvml.open == 0


def test_bad_arguments_raise_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="source must be one of .*'auto'"):
        EnergyMeter("bogus", powercap_root=str(tmp_path))
    with pytest.raises(ValueError, match="gpus"):
        EnergyMeter("rapl", gpus=[], powercap_root=str(tmp_path))
    with pytest.raises(RuntimeError, match="start"):
        EnergyMeter("rapl", powercap_root=str(tmp_path)).stop()


def test_cost_formulas_by_hand():
    assert joules_per_sample(100.0, 40) == pytest.approx(2.5)
    assert run_cost(8, 24, 2.5) == pytest.approx(480.0)                  # 8 GPUs x 24 h x 2.5 per GPU-hour
    assert energy_cost(7.2e6, 0.30) == pytest.approx(0.60)               # 7.2 MJ = 2 kWh at 0.30 per kWh
    assert energy_kwh(700, 8, 10) == pytest.approx(56.0)                 # 5.6 kW for 10 h
    assert energy_kwh(700, 8, 10, pue=1.2) == pytest.approx(67.2)
    for bad in (lambda: joules_per_sample(1.0, 0), lambda: run_cost(-1, 1, 1), lambda: run_cost(1, 1, -0.5),
                lambda: energy_cost(-1.0, 0.3), lambda: energy_kwh(700, 8, 10, pue=0.9),
                lambda: energy_kwh(-700, 8, 10)):
        with pytest.raises(ValueError):
            bad()


def test_the_gpus_cuda_hides_are_not_metered(powercap, fake_nvml, monkeypatch):
    """Issue 31, item 5. NVML ignores CUDA_VISIBLE_DEVICES: ranks on CPU whose GPU the launcher hid would
    report the idle GPU's energy as the CPU job's, and a rank given GPU 1 would sum every GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")                 # what the launcher gives ranks on CPU
    m = EnergyMeter(powercap_root=str(powercap))
    assert m.source == "rapl"                                      # the CPU packages, not the idle GPU
    assert not EnergyMeter("nvml").available and "hides them" in EnergyMeter("nvml").reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with EnergyMeter("nvml") as one:
        fake_nvml.mj[0] += 4000
        fake_nvml.mj[1] += 250
    assert one.joules == pytest.approx(0.25)
    assert energy.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,2,MIG-x,3"}) == ["GPU-aaaa", 2]
    assert energy.visible_gpus({}) is None and energy.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_a_window_too_short_for_nvml_is_said_not_reported(fake_nvml, monkeypatch):
    """NVML updates the counter every 20-100 ms: a few ms of GPU work read 0 J or one update's worth."""
    monkeypatch.setattr(energy, "MIN_NVML_WINDOW_S", 1.0)
    with EnergyMeter("nvml") as m:
        fake_nvml.mj[0] += 1000
    assert m.joules is None and "too short for NVML" in m.reason and "at least 1 s" in m.reason


def test_a_gpu_rank_without_nvml_reports_no_energy_not_the_cpus(powercap, no_nvml, monkeypatch):
    """ddp_speedup.py on a GPU rank where nvidia-ml-py is missing and RAPL is readable (review M4): the
    meter must not fall back to the CPU packages, whose joules the run would report as its GPUs' (lesson 11's
    J/sample). Not measured: the reason names NVML. On the CPU tier RAPL is the meter."""
    import ddp_speedup

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid="GPU-0"))
    gpu = ddp_speedup.energy_meter(torch.device("cuda", 0), powercap_root=str(powercap))
    assert gpu.source is None and "pynvml is not installed" in gpu.reason
    assert ddp_speedup.energy_meter(torch.device("cpu"), powercap_root=str(powercap)).source == "rapl"
