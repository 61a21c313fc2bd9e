"""Contract of the FireSim adapter with the real tools, as far as CI can hold it:
- the generated config_runtime.yaml / config_hwdb.yaml entry / workload JSON carry exactly the key sets of
  FireSim's sample configs (firesim_schema, read at firesim/firesim@FIRESIM_COMMIT; pinned below);
- the FAKE `firesim` rejects a file missing any of those keys, as the real manager's parser does;
- with a FireSim checkout (KERNELFLEET_TEST_FIRESIM_DIR, set up as docs/firesim.md says) the real
  `firesim runcheck` accepts the files, and the key sets match its sample files;
- with GEMMINI_ROCC_TESTS (a gemmini-rocc-tests checkout with rocc-software and riscv-tests) and Debian's
  riscv64-unknown-elf-gcc + picolibc, every generated program compiles and links against the real gemmini.h.
Skipped parts say why."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from service.tuning.gemmini.backends import firesim_schema as schema
from service.tuning.gemmini.backends.firesim import BitstreamRegistry, FireSimBackend
from service.tuning.gemmini.backends.firesim_program import baremetal_build_cmd, render_program
from service.tuning.gemmini.backends.gemmini_params import generator_args, render_params_h
from service.tuning.gemmini.gemmini_h import default_point
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping
from tests.tuning.gemmini.firesim_fake import make_fake_checkout

# the key names of firesim/firesim@be558e3f deploy/sample-backup-configs/sample_config_runtime.yaml (facts)
SAMPLE_RUNTIME_KEYS = {
    "run_farm": {"base_recipe"},  # + recipe_arg_overrides, commented in the sample, filled by managerinit
    "metasimulation": {
        "metasimulation_enabled",
        "metasimulation_host_simulator",
        "metasimulation_only_plusargs",
        "metasimulation_only_vcs_plusargs",
    },
    "target_config": {
        "topology",
        "no_net_num_nodes",
        "link_latency",
        "switching_latency",
        "net_bandwidth",
        "profile_interval",
        "default_hw_config",
        "plusarg_passthrough",
    },
    "tracing": {"enable", "output_format", "selector", "start", "end"},
    "autocounter": {"read_rate"},
    "workload": {"workload_name", "terminate_on_completion", "suffix_tag"},
    "host_debug": {"zero_out_dram", "disable_synth_asserts"},
    "synth_print": {"start", "end", "cycle_prefix"},
}
# ... of sample_config_hwdb.yaml's entry, and of run-farm-recipes/externally_provisioned.yaml's managerinit block
SAMPLE_HWDB_ENTRY_KEYS = {
    "bitstream_tar",
    "deploy_quintuplet_override",
    "deploy_makefrag_override",
    "custom_runtime_config",
}
EXTERNALLY_PROVISIONED_ARGS = {"default_platform", "default_simulation_dir", "default_fpga_db", "run_farm_hosts_to_use"}
# ... of deploy/workloads/null.json (a workload without rootfs)
NULL_WORKLOAD_KEYS = {
    "benchmark_name",
    "common_bootbinary",
    "common_rootfs",
    "common_outputs",
    "common_simulation_outputs",
}

LAYERS = [Layer.gemm("g64", 64, 64, 64), Layer.gemm("g_odd", 40, 72, 24), Layer.conv("c8", 8, 8, 16, 16, 3, 3)]


def test_schema_module_is_pinned_to_the_commit_read() -> None:
    assert schema.FIRESIM_COMMIT.startswith("be558e3f")
    assert {s: set(k) for s, k in schema.RUNTIME_SECTIONS.items()} == {
        **SAMPLE_RUNTIME_KEYS,
        "run_farm": {"base_recipe", "recipe_arg_overrides"},
    }
    assert set(schema.HWDB_ENTRY_KEYS) == SAMPLE_HWDB_ENTRY_KEYS
    assert set(schema.RUN_FARM_OVERRIDE_KEYS) == EXTERNALLY_PROVISIONED_ARGS
    assert set(schema.WORKLOAD_KEYS) == NULL_WORKLOAD_KEYS


@pytest.fixture
def backend(tmp_path: Path) -> FireSimBackend:
    make_fake_checkout(tmp_path / "firesim")
    return FireSimBackend(tmp_path / "firesim", tmp_path / "registry.json")


def _entry(tmp_path: Path) -> dict[str, object]:
    return {"hwdb_name": "kf_default", "bitstream_tar": str(tmp_path / "b.tar.gz"), "generator_args": {}}


def test_generated_files_carry_exactly_the_sample_keys(backend: FireSimBackend, tmp_path: Path) -> None:
    runtime, hwdb = backend.write_run_files(DEFAULT_HW, _entry(tmp_path), "kf-bench", "t1")
    rt = json.loads(runtime.read_text())
    assert {s: set(v) - {"recipe_arg_overrides"} for s, v in rt.items()} == SAMPLE_RUNTIME_KEYS
    overrides = rt["run_farm"]["recipe_arg_overrides"]
    assert set(overrides) == EXTERNALLY_PROVISIONED_ARGS
    # local / externally provisioned, never EC2 by default
    assert rt["run_farm"]["base_recipe"] == "run-farm-recipes/externally_provisioned.yaml"
    assert overrides["default_platform"] == "XilinxAlveoU250InstanceDeployManager"
    assert overrides["run_farm_hosts_to_use"] == [{"localhost": "one_fpgas_spec"}]
    assert rt["metasimulation"]["metasimulation_enabled"] is False
    assert rt["target_config"]["default_hw_config"] == "kf_default"
    assert rt["workload"] == {"workload_name": "kf-bench.json", "terminate_on_completion": False, "suffix_tag": "t1"}
    assert set(json.loads(hwdb.read_text())["kf_default"]) == SAMPLE_HWDB_ENTRY_KEYS
    wl = json.loads((backend.dir / "deploy" / "workloads" / "kf-bench.json").read_text())
    assert set(wl) >= NULL_WORKLOAD_KEYS and set(wl) - NULL_WORKLOAD_KEYS == {"workloads"}
    assert wl["common_rootfs"] is None and wl["workloads"][0]["bootbinary"] == "kf-bench-baremetal"


def _runcheck(backend: FireSimBackend, runtime: Path, hwdb: Path) -> subprocess.CompletedProcess[str]:
    cmd = backend._manager_cmd("runcheck", ["-c", str(runtime), "-a", str(hwdb)])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


MISSING = [("runtime", s, k) for s, keys in schema.RUNTIME_SECTIONS.items() for k in keys]
MISSING += [("runtime", "run_farm.recipe_arg_overrides", k) for k in schema.RUN_FARM_OVERRIDE_KEYS]
MISSING += [("hwdb", "", k) for k in schema.HWDB_ENTRY_KEYS] + [("workload", "", k) for k in schema.WORKLOAD_KEYS]


@pytest.mark.parametrize(("file", "section", "key"), MISSING, ids=[f"{f}:{s}.{k}" for f, s, k in MISSING])
def test_fake_firesim_rejects_a_file_missing_a_sample_key(
    backend: FireSimBackend, tmp_path: Path, file: str, section: str, key: str
) -> None:
    runtime, hwdb = backend.write_run_files(DEFAULT_HW, _entry(tmp_path), "kf-bench", "t1")
    assert _runcheck(backend, runtime, hwdb).returncode == 0  # as generated: accepted
    path = {
        "runtime": runtime,
        "hwdb": hwdb,
        "workload": backend.dir / "deploy" / "workloads" / "kf-bench.json",
    }[file]
    data = json.loads(path.read_text())
    node = data["kf_default"] if file == "hwdb" else data
    for part in filter(None, section.split(".")):
        node = node[part]
    del node[key]
    path.write_text(json.dumps(data))
    r = _runcheck(backend, runtime, hwdb)
    assert r.returncode != 0 and f"missing key {key!r}" in r.stderr


def test_fake_firesim_needs_the_sourceme_environment(backend: FireSimBackend, tmp_path: Path) -> None:
    runtime, hwdb = backend.write_run_files(DEFAULT_HW, _entry(tmp_path), "kf-bench", "t1")
    (backend.dir / "sourceme-manager.sh").write_text("source ./env.sh\n")  # no FIRESIM_SOURCED
    assert _runcheck(backend, runtime, hwdb).returncode != 0


def test_registry_records_what_the_generator_is_given(tmp_path: Path) -> None:
    reg = BitstreamRegistry(tmp_path / "r.json")
    hw = HwConfig(dim=32, sp_kib=512, acc_kib=128, dataflow="OS", dma_buswidth=64)
    reg.register(hw, "kf_32", "/bits/kf_32.tar.gz")
    args = reg.lookup(hw)["generator_args"]
    # the searched knobs
    assert (args["meshRows"], args["meshColumns"], args["dataflow"], args["dma_buswidth"]) == (32, 32, "OS", 64)
    assert (args["sp_capacity_kib"], args["acc_capacity_kib"]) == (512, 128)
    # Gemmini's defaultConfig where the search did not choose (ucb-bar/gemmini@8c3f9923 Configs.scala)
    assert args["max_in_flight_mem_reqs"] == 16 and args["dma_maxbytes"] == 64
    assert (args["sp_banks"], args["acc_banks"], args["sp_singleported"]) == (4, 2, True)
    assert (args["inputType"], args["accType"], args["spatialArrayOutputType"]) == ("SInt8", "SInt32", "SInt20")
    assert (args["ld_queue_length"], args["st_queue_length"], args["ex_queue_length"]) == (8, 2, 8)
    assert args["tlb_size"] == 4 and args["acc_read_full_width"] is True
    assert reg.configs() == [hw]


def _macros(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (.+)$", text, re.M))


def test_params_header_of_the_default_config() -> None:
    m = _macros(render_params_h(generator_args(DEFAULT_HW)))
    assert {k: m[k] for k in ("XCUSTOM_ACC", "DIM", "BANK_NUM", "BANK_ROWS", "ACC_ROWS", "MAX_BYTES")} == {
        "XCUSTOM_ACC": "3",
        "DIM": "16",
        "BANK_NUM": "4",
        "BANK_ROWS": "4096",
        "ACC_ROWS": "1024",
        "MAX_BYTES": "64",
    }
    m32 = _macros(render_params_h(generator_args(HwConfig(dim=32, sp_kib=512, acc_kib=128))))
    assert (m32["DIM"], m32["BANK_ROWS"], m32["ACC_ROWS"]) == ("32", "4096", "1024")


# -- gated on the real tools ------------------------------------------------------------------------------
def _rocc_tests() -> Path:
    root = os.environ.get("GEMMINI_ROCC_TESTS")
    if not root:
        pytest.skip("GEMMINI_ROCC_TESTS is not set (a gemmini-rocc-tests checkout; docs/firesim.md)")
    path = Path(root)
    for need in ("include/gemmini.h", "rocc-software/src/xcustom.h", "riscv-tests/benchmarks/common/crt.S"):
        if not (path / need).is_file():
            pytest.skip(f"GEMMINI_ROCC_TESTS={root} lacks {need} (submodules rocc-software, riscv-tests/env)")
    if not shutil.which("riscv64-unknown-elf-gcc"):
        pytest.skip("riscv64-unknown-elf-gcc not installed (apt-get install gcc-riscv64-unknown-elf)")
    if not Path("/usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs").is_file():
        pytest.skip("picolibc not installed (apt-get install picolibc-riscv64-unknown-elf)")
    return path


def test_params_header_matches_the_checked_in_default(tmp_path: Path) -> None:
    """gemmini-rocc-tests ships the header generated for the default config: ours says the same."""
    rocc = _rocc_tests()
    theirs = _macros((rocc / "include" / "gemmini_params.h").read_text())
    ours = _macros(render_params_h(generator_args(DEFAULT_HW)))
    shared = set(theirs) & set(ours)
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    # the checked-in header predates acc_read_full_width's default; everything else it defines, we define
    assert set(theirs) - set(ours) == set() and set(ours) - set(theirs) <= {"ACC_READ_FULL_WIDTH"}


CONFIGS = [DEFAULT_HW, HwConfig(dim=32, sp_kib=512, acc_kib=128), HwConfig(dim=8, dataflow="OS", dma_buswidth=64)]


@pytest.mark.parametrize("hw", CONFIGS, ids=lambda h: f"dim{h.dim}-{h.dataflow}")
def test_generated_program_compiles_against_the_real_gemmini_h(hw: HwConfig, tmp_path: Path) -> None:
    rocc = _rocc_tests()
    maps, _ = default_point(LAYERS)
    assert all(isinstance(m, Mapping) for m in maps)
    src, out = tmp_path / "kf.c", tmp_path / "kf-baremetal"
    src.write_text(render_program(hw, list(zip(LAYERS, maps, strict=True))))
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "gemmini_params.h").write_text(render_params_h(generator_args(hw)))
    r = subprocess.run(baremetal_build_cmd(src, out, tmp_path, rocc), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_bytes()[:4] == b"\x7fELF"
    # built against our header, not the checkout's default one
    pre = subprocess.run(
        [
            "riscv64-unknown-elf-gcc",
            "-E",
            "-dM",
            *baremetal_build_cmd(src, out, tmp_path, rocc, link=False)[1:-4],
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"#define DIM {hw.dim}" in pre.stdout.splitlines()


def test_real_firesim_runcheck_accepts_the_generated_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = os.environ.get("KERNELFLEET_TEST_FIRESIM_DIR")
    if not root:
        pytest.skip("KERNELFLEET_TEST_FIRESIM_DIR is not set (a FireSim checkout set up as docs/firesim.md says)")
    be = FireSimBackend(root, tmp_path / "registry.json", sourceme_args="--skip-ssh-setup")
    why = be.available()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("USER", os.environ.get("USER") or "root")  # the run-farm code reads $USER
    entry = {"hwdb_name": "kf_contract_test", "bitstream_tar": str(tmp_path / "none.tar.gz"), "generator_args": {}}
    bench = f"kf-gemmini-contract-{os.getpid()}"
    runtime, hwdb = be.write_run_files(DEFAULT_HW, entry, bench, "contract")
    try:
        r = _runcheck(be, runtime, hwdb)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        # and its sample files have the keys we pin
        yaml = pytest.importorskip("yaml")
        sample = yaml.safe_load((Path(root) / "deploy/sample-backup-configs/sample_config_runtime.yaml").read_text())
        assert {s: set(v) for s, v in sample.items()} == SAMPLE_RUNTIME_KEYS
        hw_sample = yaml.safe_load((Path(root) / "deploy/sample-backup-configs/sample_config_hwdb.yaml").read_text())
        assert all(set(e) == SAMPLE_HWDB_ENTRY_KEYS for e in hw_sample.values())
    finally:
        shutil.rmtree(runtime.parent, ignore_errors=True)
        (runtime.parent.parent / f"{bench}.json").unlink(missing_ok=True)
