"""What a Jetson reports about itself, read from sysfs the way tegrastats and jetson-stats read
it (there is no NVML on Jetson): GPU load and clocks, shared-DRAM use, temperatures per
thermal zone, INA3221 power rails, the nvpmodel power mode, and throttling (over-current
events and thermal zones past their first passive trip point). Off a Jetson there is nothing
to read and `Tegra.read()` is None.

Paths, relative to a root that tests point at a fake tree (JetPack 6 / L4T R36 on Orin):

- `etc/nv_tegra_release`: "# R36 (release), REVISION: 4.3, ..." -- present on every L4T
  install; its presence is what makes this a Jetson.
- `sys/class/devfreq/<dev>/device/of_node/name` is "gpu" (Orin, JetPack 6), "ga10b",
  "gv11b" or "gp10b" for the integrated GPU (jetson-stats `jtop/core/gpu.py` find_igpu).
  Its `device/load` is the GPU's busy share in per mille (0..1000, what tegrastats prints as
  GR3D_FREQ %); the devfreq directory has `cur_freq`, `max_freq` (the power mode's cap) and
  `available_frequencies` in Hz (Linux devfreq ABI, Documentation/ABI/testing/sysfs-class-
  devfreq). JetPack 4 has no devfreq node named so: `sys/devices/gpu.0/load` or
  `sys/devices/platform/gpu.0/load` instead.
- `proc/meminfo` MemTotal/MemAvailable: the GPU allocates from the same DRAM (tegrastats'
  RAM figure); edged_gpu_memory_* mean here what NVML's mean on a discrete GPU.
- `sys/class/thermal/thermal_zone*/{type,temp,trip_point_<n>_type,trip_point_<n>_temp}`,
  millidegrees C; Orin's zones are cpu-, gpu-, cv0..2-, soc0..2- and tj-thermal; a zone
  reading -256000 is offline (jetson-stats `temperature.py`).
- `sys/class/hwmon/hwmon*/name` "ina3221" (JetPack 5+; JetPack 4 used iio `rail_name_*`):
  `in<n>_label` (e.g. VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 on AGX Orin; VDD_IN,
  VDD_CPU_GPU_CV, VDD_SOC on Orin NX/Nano), `in<n>_input` mV, `curr<n>_input` mA. Channel 7 is
  the sum of shunt voltages and labels with "NC" are unconnected (jetson-stats `power.py`).
- `sys/class/hwmon/hwmon*/name` "soctherm_oc": `oc<n>_event_cnt`, cumulative counts of
  hardware throttling on OC1 under-voltage, OC2 average and OC3 instantaneous over-current
  (Jetson Linux R36 Developer Guide, Platform Power and Performance, "Jetson Orin").
- `var/lib/nvpmodel/status` "pmode:0002 ..." names the mode nvpmodel set, and
  `etc/nvpmodel.conf` "< POWER_MODEL ID=2 NAME=15W >" its name.
- `sys/devices/system/cpu/cpu*/cpufreq/{scaling_cur_freq,cpuinfo_max_freq}` in kHz.
- `sys/kernel/debug/bpmp/debug/clk/emc/{rate,max_rate}` in Hz: the memory clock, readable by
  root only (debugfs); left out when it cannot be read."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

GPU_NODE_NAMES = ("gpu", "ga10b", "gv11b", "gp10b")
OFFLINE_MILLI_C = -256000
OC_CAUSES = {"oc1": "under-voltage", "oc2": "average over-current",
             "oc3": "instantaneous over-current"}
_POWER_MODEL = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)")
_PMODE = re.compile(r"pmode:0*(\d+)")
_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


@dataclass(frozen=True)
class Rail:
    name: str
    volts: float
    amperes: float

    @property
    def watts(self) -> float:
        return self.volts * self.amperes


@dataclass(frozen=True)
class Clock:
    hz: int
    max_hz: int | None  # what the power mode allows now
    hardware_max_hz: int | None = None  # the highest the part offers (any mode)


@dataclass(frozen=True)
class TegraStats:
    """One reading. Fields a JetPack version (or a non-root user) lacks are None or empty."""

    l4t: str | None
    gpu_load: float | None  # 0..1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperatures: dict[str, float] = field(default_factory=dict)  # zone type -> degrees C
    rails: tuple[Rail, ...] = ()
    clocks: dict[str, Clock] = field(default_factory=dict)  # gpu, cpu, emc
    power_mode: str | None = None
    power_mode_id: int | None = None
    oc_events: dict[str, int] = field(default_factory=dict)  # oc1..3 since boot
    hot_zones: tuple[str, ...] = ()  # zones at or past their first passive trip point
    throttled: bool = False  # throttling now: new over-current events, or a hot zone
    throttle_events: dict[str, int] = field(default_factory=dict)  # cause -> since edged start

    def as_dict(self) -> dict[str, object]:
        """The stats message's and the status report's `jetson` section."""
        return {
            "l4t": self.l4t, "power_mode": self.power_mode, "power_mode_id": self.power_mode_id,
            "gpu_load": None if self.gpu_load is None else round(self.gpu_load, 3),
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "temperatures_c": {k: round(v, 1) for k, v in self.temperatures.items()},
            "rails": {r.name: {"volts": round(r.volts, 3), "amperes": round(r.amperes, 3),
                               "watts": round(r.watts, 3)} for r in self.rails},
            "clocks_hz": {k: {"now": c.hz, "max": c.max_hz, "hardware_max": c.hardware_max_hz}
                          for k, c in self.clocks.items()},
            "throttled": self.throttled, "hot_zones": list(self.hot_zones),
            "throttle_events": dict(self.throttle_events), "oc_events": dict(self.oc_events),
        }


@dataclass
class _Paths:
    """Where this machine keeps each figure, found once."""

    gpu_load: Path | None = None
    gpu_devfreq: Path | None = None
    # type, temp file, first passive trip point in millidegrees (trip points are set by the
    # device tree at boot: read once)
    zones: list[tuple[str, Path, int | None]] = field(default_factory=list)
    ina: list[tuple[str, Path, Path]] = field(default_factory=list)  # label, mV, mA
    oc: dict[str, Path] = field(default_factory=dict)
    cpus: list[Path] = field(default_factory=list)
    cpu_hardware_max_hz: int | None = None  # cpuinfo_max_freq: fixed for the part


class Tegra:
    """Reads a Jetson's telemetry under `root` ("/" in the daemon). A reading is kept for
    `min_interval_s`, so /metrics, the stats message and the status report in the same moment
    share one pass over sysfs; throttle events are counted (and logged) once per pass."""

    def __init__(self, root: Path | str = "/", *, min_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._paths: _Paths | None = None
        self._jetson: bool | None = None
        self._last: tuple[float, TegraStats | None] | None = None
        self._oc_seen: dict[str, int] | None = None
        self._hot_seen: frozenset[str] = frozenset()
        self._events: dict[str, int] = {}
        self._started_now = ""  # why throttling started in the latest pass ("" if it did not)
        self._listeners: list[Callable[[str, TegraStats], None]] = []

    def is_jetson(self) -> bool:
        if self._jetson is None:
            self._jetson = (self.root / "etc/nv_tegra_release").is_file() or \
                self._find().gpu_load is not None
        return self._jetson

    def on_throttle(self, listener: Callable[[str, TegraStats], None]) -> None:
        """Call `listener(reason, stats)` when throttling starts (health.warn_on_throttle)."""
        self._listeners.append(listener)

    def off_throttle(self, listener: Callable[[str, TegraStats], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def read(self) -> TegraStats | None:
        """The current figures, or None off a Jetson. Never raises for a missing or unreadable
        file: that figure is left out."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self.min_interval_s:
                return self._last[1]
            self._started_now = ""
            stats = self._read() if self.is_jetson() else None
            self._last = (now, stats)
            started = self._started_now
        if stats is not None and started:
            for listener in self._listeners:
                try:
                    listener(started, stats)
                except Exception:  # a listener's failure must not stop the telemetry
                    logger.exception("throttle listener failed")
        return stats

    # -- one pass ----------------------------------------------------------------------------
    def _read(self) -> TegraStats:
        paths = self._find()
        temperatures, hot = _zones(paths.zones)
        oc = {name: v for name, path in paths.oc.items() if (v := _int(path)) is not None}
        new_oc = self._count(oc, hot)
        mode_id, mode = self._power_mode()
        total, available = _meminfo(self.root / "proc/meminfo")
        clocks = {}
        gpu_clock = _devfreq(paths.gpu_devfreq)
        if gpu_clock is not None:
            clocks["gpu"] = gpu_clock
        cpu_clock = _cpus(paths.cpus, paths.cpu_hardware_max_hz)
        if cpu_clock is not None:
            clocks["cpu"] = cpu_clock
        emc = self.root / "sys/kernel/debug/bpmp/debug/clk/emc"
        emc_hz = _int(emc / "rate")
        if emc_hz is not None:
            clocks["emc"] = Clock(emc_hz, _int(emc / "max_rate"))
        load = _int(paths.gpu_load) if paths.gpu_load else None
        return TegraStats(
            l4t=self._l4t(), gpu_load=None if load is None else min(load, 1000) / 1000,
            memory_used_bytes=None if total is None or available is None else total - available,
            memory_total_bytes=total, temperatures=temperatures,
            rails=tuple(r for r in (_rail(*row) for row in paths.ina) if r is not None),
            clocks=clocks, power_mode=mode, power_mode_id=mode_id, oc_events=oc,
            hot_zones=tuple(sorted(hot)), throttled=bool(new_oc or hot),
            throttle_events=dict(self._events))

    def _count(self, oc: dict[str, int], hot: set[str]) -> dict[str, int]:
        """Count and log what started throttling since the last pass: new over-current events
        (the counters run since boot; edged counts from its own start) and zones that passed
        their passive trip point. Sets what read() tells the listeners."""
        new = {}
        if self._oc_seen is not None:
            for name, value in oc.items():
                delta = value - self._oc_seen.get(name, value)
                if delta > 0:
                    new[name] = delta
        self._oc_seen = oc
        reasons = []
        for name, delta in sorted(new.items()):
            cause = f"{name} {OC_CAUSES.get(name, 'over-current')}"
            self._events[name] = self._events.get(name, 0) + delta
            reasons.append(f"{delta} {cause} event(s)")
        for zone in sorted(hot - self._hot_seen):
            self._events["thermal"] = self._events.get("thermal", 0) + 1
            reasons.append(f"{zone} past its passive trip point")
        for zone in sorted(self._hot_seen - hot):
            logger.info("thermal: %s is below its passive trip point again", zone)
        was_throttled = bool(self._hot_seen)
        self._hot_seen = frozenset(hot)
        self._started_now = "; ".join(reasons)
        if reasons:
            logger.warning("Jetson clocks capped: %s", self._started_now,
                           extra={"code": "throttled"})
        elif was_throttled and not hot:
            logger.info("Jetson: no longer throttled")
        return new

    def _l4t(self) -> str | None:
        text = _text(self.root / "etc/nv_tegra_release")
        match = _RELEASE.search(text or "")
        return f"R{match.group(1)}.{match.group(2)}" if match else None

    def _power_mode(self) -> tuple[int | None, str | None]:
        match = _PMODE.search(_text(self.root / "var/lib/nvpmodel/status") or "")
        if match is None:
            return None, None
        mode_id = int(match.group(1))
        names = dict(_POWER_MODEL.findall(_text(self.root / "etc/nvpmodel.conf") or ""))
        return mode_id, names.get(str(mode_id))

    def _find(self) -> _Paths:
        if self._paths is None:
            self._paths = _discover(self.root)
        return self._paths


def _discover(root: Path) -> _Paths:
    paths = _Paths()
    for node in sorted((root / "sys/class/devfreq").glob("*")):
        if (_text(node / "device/of_node/name") or "").strip("\0\n ") in GPU_NODE_NAMES:
            paths.gpu_devfreq = node
            if (node / "device/load").is_file():
                paths.gpu_load = node / "device/load"
            break
    for legacy in ("sys/devices/gpu.0/load", "sys/devices/platform/gpu.0/load"):
        if paths.gpu_load is None and (root / legacy).is_file():
            paths.gpu_load = root / legacy
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*"), key=_number):
        kind = _text(zone / "type")
        if kind and (zone / "temp").is_file():
            passive = [t for trip in zone.glob("trip_point_*_type") if _text(trip) == "passive"
                       and (t := _int(zone / trip.name.replace("_type", "_temp"))) is not None]
            paths.zones.append((kind, zone / "temp", min(passive) if passive else None))
    for hwmon in sorted((root / "sys/class/hwmon").glob("hwmon*"), key=_number):
        name = _text(hwmon / "name")
        if name == "ina3221":
            for label in sorted(hwmon.glob("in*_label")):
                channel = label.name[2:-len("_label")]
                text = _text(label)
                if text and "NC" not in text.split("_") and channel != "7":
                    paths.ina.append((text, hwmon / f"in{channel}_input",
                                      hwmon / f"curr{channel}_input"))
        elif name == "soctherm_oc":
            for counter in sorted(hwmon.glob("oc*_event_cnt")):
                paths.oc[counter.name.split("_")[0]] = counter
    paths.cpus = sorted((root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"),
                        key=lambda p: _number(p.parent))
    hardware = [v for p in paths.cpus if (v := _int(p / "cpuinfo_max_freq")) is not None]
    paths.cpu_hardware_max_hz = max(hardware) * 1000 if hardware else None
    return paths


def _zones(zones: list[tuple[str, Path, int | None]]) -> tuple[dict[str, float], set[str]]:
    """Degrees C per zone (online ones), and the zones at or past their first passive trip
    point: where the kernel's thermal governor caps clocks."""
    temperatures: dict[str, float] = {}
    hot = set()
    for kind, temp, passive in zones:
        milli = _int(temp)
        if milli is None or milli <= OFFLINE_MILLI_C:
            continue
        temperatures[kind] = milli / 1000
        if passive is not None and milli >= passive:
            hot.add(kind)
    return temperatures, hot


def _rail(name: str, millivolts: Path, milliamps: Path) -> Rail | None:
    mv, ma = _int(millivolts), _int(milliamps)
    if mv is None or ma is None:
        return None
    return Rail(name, mv / 1000, ma / 1000)


def _devfreq(node: Path | None) -> Clock | None:
    if node is None:
        return None
    now = _int(node / "cur_freq")
    if now is None:
        return None
    offered = [int(f) for f in (_text(node / "available_frequencies") or "").split()
               if f.isdigit()]
    return Clock(now, _int(node / "max_freq"), max(offered) if offered else None)


def _cpus(cpus: list[Path], hardware_max_hz: int | None) -> Clock | None:
    """The fastest core's clock now, against the highest any core allows (kHz in sysfs)."""
    now = [v for p in cpus if (v := _int(p / "scaling_cur_freq")) is not None]
    if not now:
        return None
    caps = [v for p in cpus if (v := _int(p / "scaling_max_freq")) is not None]
    return Clock(max(now) * 1000, max(caps) * 1000 if caps else None, hardware_max_hz)


def _meminfo(path: Path) -> tuple[int | None, int | None]:
    values = {}
    for line in (_text(path) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024
    return values.get("MemTotal"), values.get("MemAvailable")


def _number(path: Path) -> int:
    digits = re.sub(r"\D", "", path.name)
    return int(digits) if digits else 0


def _text(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:  # absent on this JetPack, or root only
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None
