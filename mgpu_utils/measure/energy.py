"""Energy and cost of a run (notebooks/11_benchmarking.ipynb).

:class:`EnergyMeter` reads the hardware's own energy counters around a block of code: NVML on NVIDIA
GPUs (Volta and newer) or Linux RAPL on Intel and AMD CPU packages. A machine with neither is a normal
case: the meter says why in ``reason`` and reports ``joules = None``. The cost helpers turn GPU-hours
and joules into money: :func:`run_cost` (rented GPUs), :func:`energy_kwh` and :func:`energy_cost`.
"""

from __future__ import annotations

import os
import re
import time

SOURCES = ("auto", "rapl", "nvml")
J_PER_KWH = 3.6e6
_PACKAGE = re.compile(r"intel-rapl:\d+")           # a package zone; its sub-zones are intel-rapl:N:M


#: NVML updates a GPU's energy counter every 20-100 ms (it depends on the GPU): a shorter window reads 0 J
#: or one update's worth. The meter refuses to report a GPU window shorter than this, in seconds.
MIN_NVML_WINDOW_S = 1.0


def visible_gpus(environ: dict | None = None) -> list[int | str] | None:
    """The GPUs CUDA lets this process use, as :class:`EnergyMeter` names them (lesson 11).

    ``CUDA_VISIBLE_DEVICES`` unset: None (every GPU). Set: its entries up to the first one CUDA would
    stop at, as NVML indices (ints) or UUIDs (``GPU-...``); ``""`` or ``-1`` hide every GPU: ``[]``.
    NVML ignores ``CUDA_VISIBLE_DEVICES`` and numbers GPUs in PCI order, so without this a CPU job whose
    GPUs the launcher hid would be metered as the idle GPU's energy. MIG instances are not metered (their
    energy is the whole GPU's): they end the list. Integer entries are NVML's PCI-order indices, which
    CUDA's numbering matches with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (and on most single-model machines).
    """
    raw = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[int | str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if entry.isdigit():
            out.append(int(entry))
        elif entry.startswith("GPU-"):
            out.append(entry)
        else:                                       # "", "-1", MIG-..., or anything CUDA stops at
            break
    return out


def _read_int(path: str) -> int:
    """The integer in a sysfs file (every counter read goes through here: tests replace it)."""
    with open(path) as f:
        return int(f.read().strip())


def rapl_zones(powercap_root: str = "/sys/class/powercap") -> list[dict]:
    """The RAPL package zones: the directories ``intel-rapl:N`` directly under ``powercap_root`` (AMD
    CPUs use the same names on recent kernels). Sub-zones (``intel-rapl:0:0``: core, uncore) are counted
    inside their package and are not listed.

    Returns:
        ``[{"path", "name", "readable"}]`` sorted by N; ``name`` is the zone's ``name`` file ("package-0";
        "psys" is a laptop's platform zone), ``readable`` whether this user can read ``energy_uj``
        (root-only on many distributions since 2020). ``[]`` when there are none.
    """
    try:
        entries = sorted((e for e in os.listdir(powercap_root) if _PACKAGE.fullmatch(e)),
                         key=lambda e: int(e.split(":")[1]))
    except OSError:
        return []
    zones = []
    for entry in entries:
        path = os.path.join(powercap_root, entry)
        try:
            with open(os.path.join(path, "name")) as f:
                name = f.read().strip()
        except OSError:
            name = entry
        try:
            readable = _read_int(os.path.join(path, "energy_uj")) >= 0
        except (OSError, ValueError):
            readable = False
        zones.append({"path": path, "name": name, "readable": readable})
    return zones


class EnergyMeter:
    """Energy used between :meth:`start` and :meth:`stop`, or in ``with EnergyMeter() as m: ...``.

    Args:
        source: "auto" (NVML when an NVIDIA GPU is reachable, else RAPL), "rapl" (CPU packages only) or
            "nvml" (GPUs only; needs ``pip install nvidia-ml-py``, module ``pynvml``).
        gpus: the GPUs to sum: NVML indices (ints; NVML numbers GPUs in PCI order, which can differ from
            CUDA's numbering and ignores ``CUDA_VISIBLE_DEVICES``) or UUIDs (strings, as
            ``str(torch.cuda.get_device_properties(d).uuid)`` gives them: the safe way to name a rank's
            own GPU); None means every GPU this process may use (:func:`visible_gpus`: none when
            ``CUDA_VISIBLE_DEVICES`` hides them, as the launcher does for ranks on CPU).
        powercap_root: where the RAPL zones live.

    After :meth:`stop`: ``joules`` (float; None when not available, or when an NVML window was shorter
    than :data:`MIN_NVML_WINDOW_S`: ``reason`` then says so), ``seconds`` (wall time, from
    ``time.perf_counter``), ``watts`` (joules / seconds). Always: ``available``, ``source`` ("rapl",
    "nvml" or None) and ``reason`` (one line saying why not available; "" when available).

    RAPL sums the ``package-N`` zones (not ``psys``, which contains them; DRAM is a zone of its own and
    not counted). Its counters wrap at ``max_energy_range_uj`` (~262 kJ: minutes to an hour of a busy
    CPU); one wrap between start and stop is corrected, more are not. NVML counts millijoules per GPU.

    Raises:
        ValueError: an unknown ``source``, or ``gpus=[]``. A machine without counters raises nothing.
    """

    def __init__(self, source: str = "auto", gpus: list[int | str] | None = None,
                 powercap_root: str = "/sys/class/powercap"):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}: "
                             f"source='auto' uses whatever this machine has")
        if gpus is not None and not gpus:
            raise ValueError("gpus=[] measures nothing: pass GPU indices, or None for every GPU")
        hidden = gpus is None and visible_gpus() == []
        if gpus is None:
            gpus = visible_gpus() or None
        self.gpus, self.powercap_root = gpus, powercap_root
        self.source, self.reason, self.joules, self.seconds = None, "", None, 0.0
        self._zones, self._nvml, self._t0, self._start = [], None, None, None
        nvml_why = "" if source not in ("auto", "nvml") else (
            "no GPU for this process (CUDA_VISIBLE_DEVICES hides them)" if hidden else self._probe_nvml())
        rapl_why = self._probe_rapl() if source in ("auto", "rapl") and self.source is None else ""
        if self.source is None:
            why = {"auto": f"{rapl_why} and {nvml_why}", "rapl": rapl_why, "nvml": nvml_why}[source]
            self.reason = f"energy not available on this machine: {why}"

    @property
    def available(self) -> bool:
        """Whether the meter reads real counters (if not, ``reason`` says why)."""
        return self.source is not None

    @property
    def watts(self) -> float | None:
        """Average power in watts (joules / seconds); None before :meth:`stop` or when not available."""
        return self.joules / self.seconds if self.joules is not None and self.seconds > 0 else None

    def _probe_rapl(self) -> str:
        """Set ``source`` to "rapl", or return why not."""
        zones = [z["path"] for z in rapl_zones(self.powercap_root) if z["name"] != "psys"]
        if not zones:
            return f"no readable Linux RAPL counters under {self.powercap_root}"
        try:
            self._zones = [(p, _read_int(os.path.join(p, "max_energy_range_uj"))) for p in zones]
            for p in zones:
                _read_int(os.path.join(p, "energy_uj"))
        except PermissionError as e:
            return (f"RAPL counters under {self.powercap_root} are not readable ({e.strerror}: {e.filename}; "
                    f"root-only on many distributions since 2020, for security): run as root or "
                    f"`sudo chmod o+r {self.powercap_root}/intel-rapl:*/energy_uj`")
        except (OSError, ValueError) as e:
            return f"RAPL counters under {self.powercap_root} could not be read ({e})"
        self.source = "rapl"
        return ""

    def _probe_nvml(self) -> str:
        """Set ``source`` to "nvml", or return why not."""
        try:
            import pynvml
        except ImportError:
            return "no NVIDIA GPU (NVML: pynvml is not installed: pip install nvidia-ml-py)"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            return f"no NVIDIA GPU (NVML: {e})"
        try:
            if self.gpus is None and pynvml.nvmlDeviceGetCount() == 0:
                return "no NVIDIA GPU (NVML sees 0 devices)"
            self._nvml_joules(pynvml)
        except pynvml.NVMLError as e:
            return f"no NVIDIA GPU energy counter (NVML: {e}; it needs a Volta or newer GPU)"
        finally:
            pynvml.nvmlShutdown()
        self.source = "nvml"
        return ""

    def _nvml_joules(self, pynvml) -> float:
        ids = range(pynvml.nvmlDeviceGetCount()) if self.gpus is None else self.gpus
        handles = [pynvml.nvmlDeviceGetHandleByUUID(i if i.startswith("GPU-") else f"GPU-{i}")
                   if isinstance(i, str) else pynvml.nvmlDeviceGetHandleByIndex(i) for i in ids]
        return sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1e3   # mJ -> J

    def _read(self) -> list:
        """[joules of the GPUs] on NVML, or microjoules per RAPL package."""
        if self._nvml is not None:
            return [self._nvml_joules(self._nvml)]
        return [_read_int(os.path.join(p, "energy_uj")) for p, _ in self._zones]

    def start(self) -> EnergyMeter:
        """Read the counters, then start the clock; NVML stays initialised until :meth:`stop`. Returns self."""
        self.joules, self.seconds = None, 0.0
        if self.source == "nvml":
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        self._start = self._read() if self.available else None
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> float | None:
        """Stop the clock, read the counters; sets and returns ``joules`` (None when not available).

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._t0 is None:
            raise RuntimeError("EnergyMeter.stop() before start(): call start() first, or use `with EnergyMeter()`")
        self.seconds, self._t0 = time.perf_counter() - self._t0, None
        if not self.available:
            return None
        try:
            end = self._read()
        finally:
            if self._nvml is not None:
                self._nvml.nvmlShutdown()
            self._nvml = None
        if self.source == "nvml":
            if self.seconds < MIN_NVML_WINDOW_S:
                self.reason = (f"a {self.seconds * 1e3:.0f} ms window is too short for NVML's energy counter "
                               f"(updated every 20-100 ms): measure at least {MIN_NVML_WINDOW_S:g} s")
                return None
            self.joules = end[0] - self._start[0]
        else:                                             # a lower reading: the counter wrapped once
            uj = [e - s + (rng if e < s else 0) for e, s, (_, rng) in zip(end, self._start, self._zones)]
            self.joules = sum(uj) / 1e6
        return self.joules

    def __enter__(self) -> EnergyMeter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def joules_per_sample(joules: float, samples: int) -> float:
    """Energy per training sample, in joules. Raises ValueError for samples <= 0 or joules < 0."""
    if samples <= 0 or joules < 0:
        raise ValueError(f"need samples > 0 and joules >= 0, got samples={samples}, joules={joules}")
    return joules / samples


def run_cost(gpus: int, hours: float, price_per_gpu_hour: float) -> float:
    """Cost of renting ``gpus`` GPUs for ``hours`` hours: gpus x hours x price, in the price's currency.
    Raises ValueError for a negative input."""
    if min(gpus, hours, price_per_gpu_hour) < 0:
        raise ValueError(f"inputs must be >= 0, got gpus={gpus}, hours={hours}, price={price_per_gpu_hour}")
    return gpus * hours * price_per_gpu_hour


def energy_cost(joules: float, price_per_kwh: float) -> float:
    """Electricity cost of ``joules`` at ``price_per_kwh`` (1 kWh = 3.6e6 J), in the price's currency.
    Raises ValueError for a negative input."""
    if joules < 0 or price_per_kwh < 0:
        raise ValueError(f"inputs must be >= 0, got joules={joules}, price_per_kwh={price_per_kwh}")
    return joules / J_PER_KWH * price_per_kwh


def energy_kwh(watts_per_gpu: float, gpus: int, hours: float, pue: float = 1.0) -> float:
    """Energy of a run in kWh from the average power per GPU in watts: watts x gpus x hours x PUE / 1000.
    PUE (>= 1) is the data centre's total power over its IT power: cooling and power conversion on top
    of the GPUs (typically 1.1-1.6). Raises ValueError for pue < 1 or a negative input."""
    if pue < 1:
        raise ValueError(f"pue is total facility power / IT power, so >= 1; got {pue}")
    if min(watts_per_gpu, gpus, hours) < 0:
        raise ValueError(f"inputs must be >= 0, got watts={watts_per_gpu}, gpus={gpus}, hours={hours}")
    return watts_per_gpu * gpus * hours * pue / 1e3
