"""The daemon's parts that daemon.py's story calls in turn: what `run` binds first
(startup.py), one discovery pass over the enabled vendors (inventory.py), the node's
devices kept current (node.py), and the monitors while it runs (monitors.py)."""
