"""The record on disk: snapshot, journal, the Checkpoint store, recovery."""
