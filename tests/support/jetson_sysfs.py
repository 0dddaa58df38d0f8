"""A fake filesystem root laid out like JetPack 6 (L4T R36.4.3) on a Jetson AGX Orin, for
edged.hardware.tegra. Each file is where Jetson Linux puts it (see edged/hardware/tegra.py's
docstring for the source of each path); values are plausible for a loaded AGX Orin in mode 2
(30W)."""

from __future__ import annotations

from pathlib import Path

RELEASE = ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
           "DATE: Wed Jan  8 01:49:37 UTC 2025\n")
NVPMODEL_CONF = """< PARAM TYPE=FILE NAME=CPU_ONLINE >
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MODE_15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MODE_30W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=3 NAME=MODE_50W >
< PM_CONFIG DEFAULT=2 >
"""
# AGX Orin zones (cpu, gpu, cv0..2, soc0..2, tj); trip points as its device tree sets them.
ZONES = [("cpu-thermal", 61500), ("gpu-thermal", 58250), ("cv0-thermal", 55500),
         ("cv1-thermal", 56000), ("cv2-thermal", 55000), ("soc0-thermal", 57000),
         ("soc1-thermal", 56500), ("soc2-thermal", 57500), ("tj-thermal", 61500)]
GPU_FREQS = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
             1020000000, 1122000000, 1224000000, 1300500000]


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def orin_root(root: Path, *, gpu_load_permille: int = 734, oc3_events: int = 12) -> Path:
    """Build the tree under `root` and return it."""
    write(root, "etc/nv_tegra_release", RELEASE)
    write(root, "etc/nvpmodel.conf", NVPMODEL_CONF)
    write(root, "var/lib/nvpmodel/status", "pmode:0002 fmode:default")
    write(root, "proc/meminfo", "MemTotal:       31997100 kB\nMemFree:         9000000 kB\n"
          "MemAvailable:   20997100 kB\nBuffers:           10000 kB\n")
    # The GPU: /sys/class/devfreq/17000000.gpu -> ../../devices/platform/bus@0/17000000.gpu/...
    gpu = root / "sys/devices/platform/bus@0/17000000.gpu"
    write(root, str(gpu.relative_to(root) / "of_node/name"), "gpu\0")
    write(root, str(gpu.relative_to(root) / "load"), str(gpu_load_permille))
    devfreq = gpu / "devfreq/17000000.gpu"
    write(root, str(devfreq.relative_to(root) / "cur_freq"), "918000000")
    write(root, str(devfreq.relative_to(root) / "max_freq"), "918000000")  # mode 2's cap
    write(root, str(devfreq.relative_to(root) / "min_freq"), "306000000")
    write(root, str(devfreq.relative_to(root) / "available_frequencies"),
          " ".join(map(str, GPU_FREQS)))
    (devfreq / "device").symlink_to(gpu)
    (root / "sys/class/devfreq").mkdir(parents=True, exist_ok=True)
    (root / "sys/class/devfreq/17000000.gpu").symlink_to(devfreq)
    # An NVDLA devfreq node that is not the GPU.
    dla = root / "sys/devices/platform/bus@0/15880000.nvdla0"
    write(root, str(dla.relative_to(root) / "of_node/name"), "nvdla0\0")
    write(root, str(dla.relative_to(root) / "devfreq/15880000.nvdla0/cur_freq"), "1600000000")
    (dla / "devfreq/15880000.nvdla0/device").symlink_to(dla)
    (root / "sys/class/devfreq/15880000.nvdla0").symlink_to(dla / "devfreq/15880000.nvdla0")
    for i, (kind, milli) in enumerate(ZONES):
        zone = f"sys/class/thermal/thermal_zone{i}"
        write(root, f"{zone}/type", kind)
        write(root, f"{zone}/temp", str(milli))
        write(root, f"{zone}/trip_point_0_type", "critical")
        write(root, f"{zone}/trip_point_0_temp", "102500")
        write(root, f"{zone}/trip_point_1_type", "passive")
        write(root, f"{zone}/trip_point_1_temp", "99000")
    write(root, "sys/class/thermal/thermal_zone9/type", "PMIC-Die")  # offline zone
    write(root, "sys/class/thermal/thermal_zone9/temp", "-256000")
    # Two INA3221 on AGX Orin (1-0040: module rails, 1-0041: carrier), JetPack 5+ hwmon ABI.
    ina = [("hwmon1", [("1", "VDD_GPU_SOC", 19104, 1472), ("2", "VDD_CPU_CV", 19112, 488),
                       ("3", "VIN_SYS_5V0", 5008, 928), ("7", "sum of shunt voltages", 0, 0)]),
           ("hwmon2", [("1", "NC", 0, 0), ("2", "VDDQ_VDD2_1V8AO", 5008, 264)])]
    for hwmon, channels in ina:
        write(root, f"sys/class/hwmon/{hwmon}/name", "ina3221")
        for channel, label, mv, ma in channels:
            write(root, f"sys/class/hwmon/{hwmon}/in{channel}_label", label)
            write(root, f"sys/class/hwmon/{hwmon}/in{channel}_input", str(mv))
            if channel != "7":
                write(root, f"sys/class/hwmon/{hwmon}/curr{channel}_input", str(ma))
                write(root, f"sys/class/hwmon/{hwmon}/curr{channel}_crit", "5000")
    write(root, "sys/class/hwmon/hwmon3/name", "soctherm_oc")
    for n, count in (("1", 0), ("2", 0), ("3", oc3_events)):
        write(root, f"sys/class/hwmon/hwmon3/oc{n}_event_cnt", str(count))
        write(root, f"sys/class/hwmon/hwmon3/oc{n}_throt_en", "1")
    write(root, "sys/class/hwmon/hwmon0/name", "pwmfan")
    for cpu in range(12):  # three clusters of four Cortex-A78AE
        freq = f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        write(root, f"{freq}/scaling_cur_freq", str(1728000 if cpu < 4 else 1497600))
        write(root, f"{freq}/scaling_max_freq", "1728000")
        write(root, f"{freq}/cpuinfo_max_freq", "2201600")
    return root


def set_value(root: Path, relative: str, value: int | str) -> None:
    write(root, relative, str(value))
