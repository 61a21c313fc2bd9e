"""`make demo` leaves nothing behind: its temporary store, broker and logs go, even when the demo fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.demo import demo_data_dir


def test_the_demo_removes_its_temporary_directory_even_on_failure(tmp_path: Path) -> None:
    with demo_data_dir(None, keep=False) as made:
        (made / "kernelfleet.db").write_bytes(b"x")
        assert made.name.startswith("kernelfleet-demo-")
    assert not made.exists()
    with pytest.raises(RuntimeError), demo_data_dir(None, keep=False) as failed:
        raise RuntimeError("the demo failed")
    assert not failed.exists()
    with demo_data_dir(None, keep=True) as kept:
        pass
    assert kept.is_dir()
    kept.rmdir()
    with demo_data_dir(tmp_path, keep=False) as given:  # a directory the user named is theirs
        pass
    assert given == tmp_path and tmp_path.is_dir()
