"""The host as the vendors share it: udev scans and uevents, hotplug, sysfs/hwmon, PCI ids,
atomic files, containerd config."""
