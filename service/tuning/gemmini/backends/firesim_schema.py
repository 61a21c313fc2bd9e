"""The FireSim manager's config schema, as key names (facts), and checks of generated configs against it.

Read from firesim/firesim at FIRESIM_COMMIT (no file copied, only the key names):
- deploy/sample-backup-configs/sample_config_runtime.yaml: the sections of config_runtime.yaml and their keys;
- deploy/run-farm-recipes/externally_provisioned.yaml: the args between "managerinit arg start/end", which
  `firesim managerinit --platform <on-prem platform>` copies into `run_farm.recipe_arg_overrides`;
- deploy/sample-backup-configs/sample_config_hwdb.yaml: the keys of an HWDB entry (the `midasexamples_gcd` one);
- deploy/workloads/null.json (a workload with no rootfs) and deploy/runtools/workload.py (the keys its
  WorkloadConfig / JobConfig read): the workload JSON.
- deploy/runtools/run_farm_deploy_managers.py: the `default_platform` classes (InstanceDeployManager subclasses).

The adapter writes every key listed here; the FAKE `firesim` used in tests rejects a file missing any of them
(or carrying a key the manager does not know), and a contract test pins these lists to the commit read.
`firesim runcheck` of the real manager accepted the adapter's files (docs/firesim.md has the command).
"""

from __future__ import annotations

from typing import Any

FIRESIM_REPO = "firesim/firesim"
FIRESIM_COMMIT = "be558e3f9c470694fae84a5002e8197540b0c0bb"  # 2026-03-09

# config_runtime.yaml: section → keys, in the sample's order
RUNTIME_SECTIONS: dict[str, tuple[str, ...]] = {
    "run_farm": ("base_recipe", "recipe_arg_overrides"),  # recipe_arg_overrides: commented in the sample,
    # filled by managerinit for externally provisioned (on-prem) farms; we always write it
    "metasimulation": (
        "metasimulation_enabled",
        "metasimulation_host_simulator",
        "metasimulation_only_plusargs",
        "metasimulation_only_vcs_plusargs",
    ),
    "target_config": (
        "topology",
        "no_net_num_nodes",
        "link_latency",
        "switching_latency",
        "net_bandwidth",
        "profile_interval",
        "default_hw_config",
        "plusarg_passthrough",
    ),
    "tracing": ("enable", "output_format", "selector", "start", "end"),
    "autocounter": ("read_rate",),
    "workload": ("workload_name", "terminate_on_completion", "suffix_tag"),
    "host_debug": ("zero_out_dram", "disable_synth_asserts"),
    "synth_print": ("start", "end", "cycle_prefix"),
}

EXTERNALLY_PROVISIONED_RECIPE = "run-farm-recipes/externally_provisioned.yaml"
AWS_EC2_RECIPE = "run-farm-recipes/aws_ec2.yaml"
# the managerinit block of externally_provisioned.yaml (→ recipe_arg_overrides)
RUN_FARM_OVERRIDE_KEYS: tuple[str, ...] = (
    "default_platform",
    "default_simulation_dir",
    "default_fpga_db",
    "run_farm_hosts_to_use",
)
# host specs the externally_provisioned recipe defines (run_farm_host_specs), the ones a 1..16-FPGA farm uses
RUN_FARM_HOST_SPECS: tuple[str, ...] = (
    "four_metasims_spec",
    "switch_only_spec",
    "one_fpga_spec",
    "one_fpgas_spec",
    "two_fpgas_spec",
    "three_fpgas_spec",
    "four_fpgas_spec",
    "five_fpgas_spec",
    "six_fpgas_spec",
    "seven_fpgas_spec",
    "eight_fpgas_spec",
    "nine_fpgas_spec",
    "ten_fpgas_spec",
    "eleven_fpgas_spec",
    "twelve_fpgas_spec",
    "thirteen_fpgas_spec",
    "fourteen_fpgas_spec",
    "fifteen_fpgas_spec",
    "sixteen_fpgas_spec",
)
DEPLOY_MANAGERS: tuple[str, ...] = (
    "EC2InstanceDeployManager",  # AWS (the sample's default); never ours by default
    "VitisInstanceDeployManager",
    "XilinxAlveoU200InstanceDeployManager",
    "XilinxAlveoU250InstanceDeployManager",
    "XilinxAlveoU280InstanceDeployManager",
    "XilinxVCU118InstanceDeployManager",
    "RHSResearchNitefuryIIInstanceDeployManager",
)
METASIM_HOST_SIMULATORS: tuple[str, ...] = ("verilator", "verilator-debug", "vcs", "vcs-debug")

# config_hwdb.yaml: the keys of one entry (bitstream_tar is the on-prem image; `agfi` replaces it on AWS)
HWDB_ENTRY_KEYS: tuple[str, ...] = (
    "bitstream_tar",
    "deploy_quintuplet_override",
    "deploy_makefrag_override",
    "custom_runtime_config",
)

# workload JSON: null.json's keys (all written), the optional ones workload.py reads, and a job's keys
WORKLOAD_KEYS: tuple[str, ...] = (
    "benchmark_name",
    "common_bootbinary",
    "common_rootfs",
    "common_outputs",
    "common_simulation_outputs",
)
WORKLOAD_OPTIONAL_KEYS: tuple[str, ...] = ("common_simulation_inputs", "workloads", "post_run_hook")
# build-time keys (FireMarshal) the manager ignores: accepted, never written by us
WORKLOAD_IGNORED_KEYS: tuple[str, ...] = ("deliver_dir", "common_args", "common_files", "no_post_run_hook")
JOB_KEYS: tuple[str, ...] = ("name", "bootbinary", "rootfs", "outputs", "simulation_outputs", "simulation_inputs")
JOB_IGNORED_KEYS: tuple[str, ...] = ("files", "command")


def _check_keys(where: str, got: Any, required: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    if not isinstance(got, dict):
        return [f"{where}: expected a mapping, got {type(got).__name__}"]
    out = [f"{where}: missing key {k!r}" for k in required if k not in got]
    out += [f"{where}: unknown key {k!r}" for k in got if k not in required and k not in allowed]
    return out


def runtime_problems(cfg: Any) -> list[str]:
    """What in a config_runtime.yaml (parsed) breaks the sample's schema; [] when it follows it."""
    out = _check_keys("config_runtime.yaml", cfg, tuple(RUNTIME_SECTIONS))
    if out:
        return out
    for section, keys in RUNTIME_SECTIONS.items():
        out += _check_keys(section, cfg[section], keys)
    if out:
        return out
    rf = cfg["run_farm"]
    if rf["base_recipe"] not in (EXTERNALLY_PROVISIONED_RECIPE, AWS_EC2_RECIPE):
        out.append(f"run_farm.base_recipe: {rf['base_recipe']!r} is not a recipe in deploy/run-farm-recipes/")
    if rf["base_recipe"] == EXTERNALLY_PROVISIONED_RECIPE:
        ov = rf["recipe_arg_overrides"]
        out += _check_keys("run_farm.recipe_arg_overrides", ov, RUN_FARM_OVERRIDE_KEYS)
        if not out:
            if ov["default_platform"] not in DEPLOY_MANAGERS:
                out.append(f"default_platform: {ov['default_platform']!r} is not one of {DEPLOY_MANAGERS}")
            hosts = ov["run_farm_hosts_to_use"]
            if not isinstance(hosts, list) or not hosts:
                out.append("run_farm_hosts_to_use: expected a non-empty list of {host: spec}")
            else:
                for h in hosts:
                    if not (isinstance(h, dict) and len(h) == 1 and next(iter(h.values())) in RUN_FARM_HOST_SPECS):
                        out.append(f"run_farm_hosts_to_use: {h!r} is not {{host: <a spec of the recipe>}}")
    meta = cfg["metasimulation"]
    if not isinstance(meta["metasimulation_enabled"], bool):
        out.append("metasimulation.metasimulation_enabled: expected a boolean")
    if meta["metasimulation_host_simulator"] not in METASIM_HOST_SIMULATORS:
        out.append(f"metasimulation_host_simulator: not one of {METASIM_HOST_SIMULATORS}")
    tc = cfg["target_config"]
    for k in ("no_net_num_nodes", "link_latency", "switching_latency", "net_bandwidth", "profile_interval"):
        if not isinstance(tc[k], int) or isinstance(tc[k], bool):
            out.append(f"target_config.{k}: expected an integer (the manager calls int() on it)")
    return out


def hwdb_problems(hwdb: Any, name: str) -> list[str]:
    """What in a config_hwdb.yaml (parsed) breaks the sample's entry schema, for the entry `name`."""
    if not isinstance(hwdb, dict) or name not in hwdb:
        return [f"config_hwdb.yaml: no entry {name!r}"]
    return _check_keys(f"config_hwdb.yaml[{name}]", hwdb[name], HWDB_ENTRY_KEYS)


def workload_problems(wl: Any) -> list[str]:
    """What in a workload JSON (parsed) the manager would not read as we mean it."""
    out = _check_keys("workload", wl, WORKLOAD_KEYS, WORKLOAD_OPTIONAL_KEYS + WORKLOAD_IGNORED_KEYS)
    if out:
        return out
    for i, job in enumerate(wl.get("workloads") or []):
        out += _check_keys(f"workloads[{i}]", job, ("name",), JOB_KEYS + JOB_IGNORED_KEYS)
    return out
