"""ResourceSlices: devices to slices (pure), the API server's rules, the sync plan, the
publisher."""
