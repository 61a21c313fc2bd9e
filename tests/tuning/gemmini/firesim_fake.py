"""A FAKE FireSim checkout for tests: the layout the adapter checks and drives (sourceme-manager.sh, env.sh,
deploy/ with the manager's recipe and config files), holding the FAKE `firesim` of fake_firesim/."""

from __future__ import annotations

import shutil
from pathlib import Path

FAKE = Path(__file__).parent / "fake_firesim"


def make_fake_checkout(root: Path) -> Path:
    deploy = root / "deploy"
    (deploy / "workloads").mkdir(parents=True, exist_ok=True)
    (deploy / "run-farm-recipes").mkdir(exist_ok=True)
    (deploy / "run-farm-recipes" / "externally_provisioned.yaml").write_text("# FAKE recipe\n")
    (deploy / "config_build_recipes.yaml").write_text("# FAKE, as `firesim managerinit` leaves it\n")
    (root / "env.sh").write_text("# FAKE env.sh (FireSim's build-setup.sh writes the real one)\n")
    shutil.copy(FAKE / "sourceme-manager.sh", root / "sourceme-manager.sh")
    (deploy / "firesim").symlink_to(FAKE / "fake_firesim")  # a link: the FAKE finds the schema module from it
    return root
