"""Score one Gemmini layer with ZigZag under a FIXED mapping; run as a child process (stdin/stdout JSON).

Standalone on purpose (no service imports): it runs in its own process so ZigZag's dump files, logging and
memory stay out of the worker. Accelerator: PE weight registers, int32 accumulator, int8 scratchpad, DRAM
behind the DMA bus, a DIM×DIM array. Scratchpad/accumulator energies per access come from the payload's `sram`
(CACTI 7 per row access, from the parent's area model) when present, else from BACO Table 6.3 per port word (the
analytical model's own constants); PE, register and DRAM energies are Table 6.3's. The layer's dataflow
(payload `flow`) picks the array model: WS keeps a weight in each PE (K on columns, C on rows, C·K unrolled,
the batch streamed); OS keeps an int32 partial sum in each PE (K on columns, output rows B on rows, the
reduction C streamed innermost through the PE, which holds the sum until the tile's reduction is done).
gemmini.h runs convs WS only, so OS is modelled for GEMMs.
"""

import json
import logging
import math
import os
import sys
import tempfile
import time

import yaml


def ceil_to(x, m):
    return -(-x // m) * m


def accelerator(hw, sram=None, flow="WS"):
    d = hw["dim"]
    spad_bw, acc_bw, bus = 2 * d * 8, 2 * d * 32, hw["dma_buswidth"]
    if sram:  # a port word is spad_bw (acc_bw) bits: that many bits' worth of CACTI row accesses
        sp, ac = sram["scratchpad"], sram["accumulator"]
        sp_cost = (sp["read_pj"] * spad_bw / sp["row_bits"], sp["write_pj"] * spad_bw / sp["row_bits"])
        acc_cost = (ac["read_pj"] * acc_bw / ac["row_bits"], ac["write_pj"] * acc_bw / ac["row_bits"])
    else:
        epa_acc = 1.94 + 0.1005 * hw["acc_kib"] / d
        epa_sp = 0.49 + 0.025 * hw["sp_kib"]
        sp_cost, acc_cost = (epa_sp * 2 * d,) * 2, (epa_acc * 2 * d,) * 2

    def mem(size, cost, bw, operands, ports, served):
        r_cost, w_cost = cost if isinstance(cost, tuple) else (cost, cost)
        return {
            "size": size,
            "r_cost": r_cost,
            "w_cost": w_cost,
            "area": 0,
            "latency": 1,
            "operands": operands,
            "ports": ports,
            "served_dimensions": served,
        }

    def port(name, typ, bw, alloc):
        return {"name": name, "type": typ, "bandwidth_min": bw, "bandwidth_max": bw, "allocation": alloc}

    if flow == "OS":
        pe_reg = {
            "pe_o_reg": mem(
                32,
                0.487,
                32,
                ["O"],
                [
                    port("r_port_1", "read", 32, ["O, tl", "O, th"]),
                    port("w_port_1", "write", 32, ["O, fh", "O, fl"]),
                ],
                [],
            )
        }
    else:
        pe_reg = {
            "pe_w_reg": mem(
                8,
                0.487,
                8,
                ["I2"],
                [port("r_port_1", "read", 8, ["I2, tl"]), port("w_port_1", "write", 8, ["I2, fh"])],
                [],
            )
        }
    return {
        "name": f"gemmini_{d}x{d}_{flow.lower()}",
        "memories": {
            **pe_reg,
            "accumulator": mem(
                hw["acc_kib"] * 8192,
                acc_cost,
                acc_bw,
                ["O"],
                [
                    port("r_port_1", "read", acc_bw, ["O, tl", "O, th"]),
                    port("w_port_1", "write", acc_bw, ["O, fh", "O, fl"]),
                ],
                ["D1", "D2"],
            ),
            "scratchpad": mem(
                hw["sp_kib"] * 8192,
                sp_cost,
                spad_bw,
                ["I1", "I2"],
                [
                    port("r_port_1", "read", spad_bw, ["I1, tl", "I2, tl"]),
                    port("w_port_1", "write", spad_bw, ["I1, fh", "I2, fh"]),
                ],
                ["D1", "D2"],
            ),
            "dram": mem(
                10**10,
                100.0 * bus / 8,
                bus,
                ["I1", "I2", "O"],
                [
                    port(
                        "rw_port_1",
                        "read_write",
                        bus,
                        ["I1, fh", "I1, tl", "I2, fh", "I2, tl", "O, fh", "O, tl", "O, fl", "O, th"],
                    )
                ],
                ["D1", "D2"],
            ),
        },
        "operational_array": {"unit_energy": 0.561, "unit_area": 1, "dimensions": ["D1", "D2"], "sizes": [d, d]},
    }


def problem(payload):
    """ZigZag workload + mapping for the layer, sizes padded up to whole tiles (and C, K to DIM)."""
    hw, lay, tiles = payload["hw"], payload["layer"], payload["tiles"]
    flow = payload.get("flow", "WS")
    if flow == "OS" and lay["op"] != "gemm":
        raise ValueError("gemmini.h runs convs WS only; an OS conv has no Gemmini mapping")
    d = hw["dim"]
    t, n = {}, {}
    for x in ("N", "P", "Q", "C", "K", "R", "S"):
        size = lay[x]
        trips = math.ceil(size / min(int(tiles.get(x, 1)), size))
        # ZigZag needs equal tiles: same trip count, tiles balanced (Gemmini's full tiles + remainder would
        # otherwise pad up to a whole extra tile); C and K stay whole DIM blocks for the spatial unroll
        tx = math.ceil(size / trips)
        if x in ("C", "K") or (flow == "OS" and x == "N"):
            tx = ceil_to(tx, d)  # the spatially unrolled dims stay whole DIM blocks
        t[x], n[x] = tx, trips
    full = {x: t[x] * n[x] for x in t}
    prec = {"W": 8, "I": 8, "O": 32, "O_final": 8}
    if lay["op"] == "gemm":
        wl = {
            "id": 0,
            "name": "gemm",
            "operator_type": "Gemm",
            "equation": "O[b][k]+=I[b][c]*W[c][k]",
            "loop_dims": ["B", "C", "K"],
            "loop_sizes": [full["N"], full["C"], full["K"]],
            "operand_precision": prec,
            "operand_source": {"I": 0},
        }
        if flow == "OS":  # per PE: the whole tile's reduction, then the next DIM×DIM output block
            inner = [["C", t["C"]], ["K", t["K"] // d], ["B", t["N"] // d]]
        else:
            inner = [["B", t["N"]], ["C", t["C"] // d], ["K", t["K"] // d]]
        outer = [["C", n["C"]], ["K", n["K"]], ["B", n["N"]]]
    else:
        s = lay["stride"]
        wl = {
            "id": 0,
            "name": "conv",
            "operator_type": "Conv",
            "equation": "O[b][k][oy][ox]+=W[k][c][fy][fx]*I[b][c][iy][ix]",
            "dimension_relations": [f"ix={s}*ox+1*fx", f"iy={s}*oy+1*fy"],
            "loop_dims": ["B", "K", "C", "OY", "OX", "FY", "FX"],
            "loop_sizes": [full["N"], full["K"], full["C"], full["P"], full["Q"], full["R"], full["S"]],
            "operand_precision": prec,
            "operand_source": {"I": 0},
        }
        inner = [
            ["OX", t["Q"]],
            ["OY", t["P"]],
            ["B", t["N"]],
            ["FX", t["S"]],
            ["FY", t["R"]],
            ["C", t["C"] // d],
            ["K", t["K"] // d],
        ]
        outer = [
            ["C", n["C"]],
            ["FX", n["S"]],
            ["FY", n["R"]],
            ["K", n["K"]],
            ["OX", n["Q"]],
            ["OY", n["P"]],
            ["B", n["N"]],
        ]
    order = [[dim, size] for dim, size in inner + outer if size > 1]
    mapping = [
        {
            "name": wl["name"],
            "spatial_mapping": {"D1": [f"K, {d}"], "D2": [f"B, {d}"] if flow == "OS" else [f"C, {d}"]},
            "temporal_ordering": order,
            "memory_operand_links": {"O": "O", "W": "I2", "I": "I1"},
        }
    ]
    # ZigZag's validator insists on a `default` entry; ours never applies (the layer's entry matches by name)
    mapping.append({**mapping[0], "name": "default"})
    del mapping[-1]["temporal_ordering"]
    padded = any(full[x] != lay[x] for x in full)
    return [wl], mapping, padded, flow


def score(payload, td):
    from zigzag.api import get_hardware_performance_zigzag

    wl, mapping, padded, flow = problem(payload)
    acc_path, map_path = os.path.join(td, "accel.yaml"), os.path.join(td, "mapping.yaml")
    with open(acc_path, "w") as f:
        yaml.safe_dump(accelerator(payload["hw"], payload.get("sram"), flow), f, sort_keys=False)
    with open(map_path, "w") as f:
        yaml.safe_dump(mapping, f, sort_keys=False)
    t0 = time.time()
    energy, latency, _ = get_hardware_performance_zigzag(
        wl, acc_path, map_path, opt="latency", dump_folder=os.path.join(td, "dump"), loma_show_progress_bar=False
    )
    return {
        "cycles": float(latency),
        "energy_pj": float(energy),
        "seconds": time.time() - t0,
        "padded_to_tiles": padded,
        "dataflow_modelled": flow,
        "temporal_ordering": mapping[0]["temporal_ordering"],
        "sram_energy": payload["sram"]["source"] if payload.get("sram") else "baco-table-6.3",
    }


def main():
    items = json.load(sys.stdin)["items"]  # one process scores a batch: ZigZag's import dominates a single call
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as td:
        print(json.dumps({"results": [score(p, td) for p in items]}))


if __name__ == "__main__":
    main()
