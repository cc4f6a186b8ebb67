"""GPU vendors: the interface the core uses (base.py), the registry listing them
(registry.py), and one folder per vendor holding everything
vendor-specific. Vendor folders never import each other; what they share is in host/."""
