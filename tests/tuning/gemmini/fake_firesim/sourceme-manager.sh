# FAKE sourceme-manager.sh for tests (the real one is FireSim's): it sources env.sh like the real one, puts
# deploy/ (where the FAKE `firesim` lives) on PATH and sets FIRESIM_SOURCED, the flag the manager checks.
source ./env.sh
export PATH=$PATH:$(pwd)/deploy
export FIRESIM_SOURCED=1
