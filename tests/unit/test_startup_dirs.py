"""What start-up created is removed when it fails, children before parents, whatever the
order it was recorded in; a clean exit keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.running.startup import make_dir, undo_dirs_on_failure


@pytest.mark.parametrize("drivers", [2, 3])
def test_a_failed_start_removes_every_directory_it_created(tmp_path: Path, drivers: int) -> None:
    plugins = tmp_path / "var" / "lib" / "kubelet" / "plugins"
    with pytest.raises(RuntimeError), undo_dirs_on_failure() as created:
        for i in range(drivers):  # the first records plugins/ and its parents, after its own
            make_dir(plugins / f"gpu{i}.example.com", "PLUGINS", created, 0o750)
        assert all((plugins / f"gpu{i}.example.com").is_dir() for i in range(drivers))
        raise RuntimeError("a later start step failed")
    assert list(tmp_path.iterdir()) == []


def test_a_clean_exit_keeps_them_and_a_failure_keeps_what_was_there(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    with undo_dirs_on_failure() as created:
        make_dir(tmp_path / "plugins" / "a", "PLUGINS", created, 0o750)
    assert (tmp_path / "plugins" / "a").is_dir()
    with pytest.raises(RuntimeError), undo_dirs_on_failure() as created:
        make_dir(tmp_path / "plugins" / "b", "PLUGINS", created, 0o750)
        raise RuntimeError("boom")
    assert sorted(p.name for p in (tmp_path / "plugins").iterdir()) == ["a"]
