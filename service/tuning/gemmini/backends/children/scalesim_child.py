"""Simulate Gemmini layers with SCALE-Sim 3 in memory; run as a child under the isolated scalesim venv.

Standalone (no service imports): SCALE-Sim needs numpy<2.4 and calls exit() on bad input, so it never runs
inside a worker. Gemmini mapped onto SCALE-Sim (research note §4.2): DIM×DIM array, scratchpad split between
IFMAP and FILTER SRAMs, OFMAP = accumulator/4 (it counts 1-byte words), DMA bus bytes/cycle per channel.
It has no tile or loop-order knobs, so the mapping is not modelled.
"""

import contextlib
import io
import json
import sys
import time
import warnings


def simulate(p):
    from scalesim.layout_utils import layouts
    from scalesim.scale_config import scale_config
    from scalesim.single_layer_sim import single_layer_sim
    from scalesim.topology_utils import topologies

    hw, lay = p["hw"], p["layer"]
    c = scale_config()
    c.array_rows = c.array_cols = hw["dim"]
    c.df = p.get("flow", hw["dataflow"]).lower()  # the layer's dataflow (a BOTH array picks per layer)
    c.ifmap_sz_kb = c.filter_sz_kb = max(1, hw["sp_kib"] // 2)
    c.ofmap_sz_kb = max(1, hw["acc_kib"] // 4)
    bw = hw["dma_buswidth"] // 8
    c.use_user_bandwidth, c.bandwidths = True, [bw]
    c.ifmap_sram_bank_bandwidth = c.filter_sram_bank_bandwidth = bw
    c.ifmap_sram_bank_num = c.filter_sram_bank_num = 1
    c.req_buf_sz_rd = c.req_buf_sz_wr = 32
    c.force_valid()
    t = topologies()
    if lay["op"] == "gemm":  # the transform topologies.load_arrays_gemm applies
        M, N, K = lay["N"], lay["K"], lay["C"]
        t.load_layer_params_from_list("l", ["l", M, K, 1, K, 1, N, 1, 1, 1, 1])
    else:
        s = lay["stride"]
        H, W = (lay["P"] - 1) * s + lay["R"], (lay["Q"] - 1) * s + lay["S"]
        t.load_layer_params_from_list("l", ["l", H, W, lay["R"], lay["S"], lay["C"], lay["K"], s, s, 1, 1])
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        sim = single_layer_sim()
        sim.set_params(layer_id=0, config_obj=c, topology_obj=t, layout_obj=layouts(), verbose=False)
        sim.run()
        comp, det = sim.get_compute_report_items(), sim.get_detail_report_items()
    return {
        "cycles": float(comp[0]),
        "compute_cycles": float(comp[1]),
        "stall_cycles": float(comp[2]),
        "util_pct": float(comp[3]),
        "dram_reads_ifmap": int(det[11]),
        "dram_reads_filter": int(det[14]),
        "dram_writes_ofmap": int(det[17]),
        "seconds": time.time() - t0,
    }


def main():
    warnings.filterwarnings("ignore")
    items = json.load(sys.stdin)["items"]
    try:
        results = [simulate(p) for p in items]
    except SystemExit as exc:  # scalesim's wrapper exits on bad input: report it instead of dying silently
        print(json.dumps({"error": f"scalesim called exit({exc.code})"}))
        return
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
