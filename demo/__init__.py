"""Sandbox demo (python -m demo)."""
