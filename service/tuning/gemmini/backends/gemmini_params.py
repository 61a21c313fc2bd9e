"""What Gemmini's generator is given for a searched config, and the `gemmini_params.h` it would write.

GEMMINI_DEFAULTS are `GemminiConfigs.defaultConfig`'s arguments (ucb-bar/gemmini@GEMMINI_COMMIT,
src/main/scala/gemmini/Configs.scala), plus the `GemminiArrayConfig` class defaults it leaves alone
(GemminiConfigs.scala) for the parameters that shape the hardware or its header. `generator_args(hw)` overrides
them with what the search chose (array size, memories, dataflow, bus width): that is what the bitstream
registry records and what a Chipyard config for the build must pass.

`render_params_h(args)` follows `GemminiArrayConfig.generateHeader` (GemminiConfigs.scala) for the integer
configs the search produces (SInt inputs/accumulator, float mvin/acc scales): same macros and typedefs,
computed the same way (BANK_ROWS = sp bytes / (banks · DIM · input bytes), ACC_ROWS = acc bytes /
(DIM · acc bytes)). gemmini.h and gemmini_testutils.h (ucb-bar/gemmini-rocc-tests) include it as
"include/gemmini_params.h"; a program must be compiled against the header of the bitstream it runs on.
"""

from __future__ import annotations

from typing import Any

from service.tuning.gemmini.space import HwConfig

GEMMINI_REPO = "ucb-bar/gemmini"
GEMMINI_COMMIT = "8c3f9923a44a2fe2c7930587be297d6d4f8c09ca"

GEMMINI_DEFAULTS: dict[str, Any] = {
    "opcodes": "custom3",
    "inputType": "SInt8",
    "weightType": "SInt8",
    "accType": "SInt32",
    "spatialArrayInputType": "SInt8",
    "spatialArrayWeightType": "SInt8",
    "spatialArrayOutputType": "SInt20",
    "tileRows": 1,
    "tileColumns": 1,
    "meshRows": 16,
    "meshColumns": 16,
    "dataflow": "BOTH",
    "sp_capacity_kib": 256,
    "acc_capacity_kib": 64,
    "sp_banks": 4,
    "acc_banks": 2,
    "sp_singleported": True,
    "acc_singleported": False,
    "spad_read_delay": 4,
    "acc_latency": 2,
    "has_training_convs": True,
    "has_max_pool": True,
    "has_nonlinear_activations": True,
    "has_dw_convs": True,
    "has_normalizations": False,
    "has_first_layer_optimizations": True,
    "has_loop_conv": True,
    "reservation_station_entries_ld": 8,
    "reservation_station_entries_st": 4,
    "reservation_station_entries_ex": 16,
    "ld_queue_length": 8,
    "st_queue_length": 2,
    "ex_queue_length": 8,
    "max_in_flight_mem_reqs": 16,
    "dma_maxbytes": 64,
    "dma_buswidth": 128,
    "tlb_size": 4,
    "mvin_scale_t": "Float(8,24)",  # mvin_scale_args = Some(ScaleArguments(..., Float(8, 24), identity "1.0"))
    "mvin_scale_acc_t": None,  # mvin_scale_acc_args = None
    "mvin_scale_shared": False,
    "acc_scale_t": "Float(8,24)",  # acc_scale_args = Some(ScaleArguments(..., Float(8, 24), identity "1.0"))
    "num_counter": 8,
    "acc_read_full_width": True,
    "acc_read_small_width": True,
    "ex_read_from_spad": True,
    "ex_read_from_acc": True,
    "ex_write_to_spad": True,
    "ex_write_to_acc": True,
}


def generator_args(hw: HwConfig) -> dict[str, Any]:
    """GemminiArrayConfig arguments for `hw`: Gemmini's defaults, with what the search chose on top."""
    chosen = hw.generator_config()
    args = dict(GEMMINI_DEFAULTS)
    for k, v in chosen.items():
        args[k] = v
    return args


def _bits(t: str) -> int:
    if not t.startswith("SInt"):
        raise ValueError(f"only SInt element types are generated here, not {t}")
    return int(t[4:])


def render_params_h(args: dict[str, Any]) -> str:
    """The gemmini_params.h Gemmini's generateHeader writes for `args` (integer configs)."""
    dim = int(args["meshColumns"]) * int(args["tileColumns"])
    if dim != int(args["meshRows"]) * int(args["tileRows"]):
        raise ValueError("Gemmini's header generator requires a square array")
    in_bits, acc_bits = _bits(args["inputType"]), _bits(args["accType"])
    for b in (in_bits, acc_bits):
        if b not in (8, 16, 32, 64):
            raise ValueError(f"Gemmini's header generator requires 8/16/32/64-bit types, not {b}")
    sp_banks, acc_banks = int(args["sp_banks"]), int(args["acc_banks"])
    sp_bytes, acc_bytes = int(args["sp_capacity_kib"]) * 1024, int(args["acc_capacity_kib"]) * 1024
    bank_rows = sp_bytes * 8 // (sp_banks * dim * in_bits)
    acc_rows = acc_banks * (acc_bytes * 8 // (acc_banks * dim * acc_bits))
    opcode = ("custom0", "custom1", "custom2", "custom3").index(args["opcodes"])
    lo, hi = -(2 ** (in_bits - 1)), 2 ** (in_bits - 1) - 1
    max_bytes = 64
    block = f"(MAX_BYTES/(DIM*{in_bits // 8}))" if dim * in_bits // 8 <= max_bytes else "1"
    block_acc = f"(MAX_BYTES/(DIM*{acc_bits // 8}))" if dim * acc_bits // 8 <= max_bytes else "1"
    if args["mvin_scale_t"] != "Float(8,24)" or args["acc_scale_t"] != "Float(8,24)":
        raise ValueError("only the default float mvin/acc scale types are generated here")
    if args["mvin_scale_acc_t"] is not None:
        raise ValueError("mvin_scale_acc_args is not generated here (Gemmini's default is None)")
    rrs = (
        "    ((shift) > 0 ? (((x) >> (shift)) + \\\n"
        "        (((shift) == 0 ? 0 : (((x) >> ((shift)-1)) & 1)) & \\\n"
        "             ((((shift) <= 1 ? 0 : ((x) & ((1 << ((shift)-1)) - 1))) != 0) | (((x) >> (shift)) & 1))))"
        " : ((x) << (-(shift))))"
    )
    lines = [
        f"// gemmini_params.h for GemminiArrayConfig {sorted(args.items())}",
        "// written by KernelFleet the way Gemmini's GemminiArrayConfig.generateHeader writes it",
        "#ifndef GEMMINI_PARAMS_H",
        "#define GEMMINI_PARAMS_H",
        "",
        "#include <stdint.h>",
        "#include <limits.h>",
        "",
        f"#define XCUSTOM_ACC {opcode}",
        f"#define DIM {dim}",
        "#define ADDR_LEN 32",
        f"#define BANK_NUM {sp_banks}",
        f"#define BANK_ROWS {bank_rows}",
        f"#define ACC_ROWS {acc_rows}",
        f"#define MAX_BYTES {max_bytes}",
        f"#define MAX_BLOCK_LEN {block}",
        f"#define MAX_BLOCK_LEN_ACC {block_acc}",
        "",
        f"typedef int{in_bits}_t elem_t;",
        f"static const elem_t elem_t_max = {hi};",
        f"static const elem_t elem_t_min = {lo};",
        f"typedef int{acc_bits}_t acc_t;",
        "typedef int64_t full_t;",
        "",
        "#define HAS_MVIN_SCALE",
        "typedef float scale_t;",
        "typedef uint32_t scale_t_bits;",
        "",
        "typedef int32_t scale_acc_t;",
        "typedef uint32_t scale_acc_t_bits;",
        "",
        "typedef float acc_scale_t;",
        "typedef uint32_t acc_scale_t_bits;",
        "",
        "#define row_align(blocks) __attribute__((aligned(blocks*DIM*sizeof(elem_t))))",
        "#define row_align_acc(blocks) __attribute__((aligned(blocks*DIM*sizeof(acc_t))))",
        "",
        "#define MVIN_SCALE_IDENTITY 1.0",
        "#define ACC_SCALE_IDENTITY 1.0",
        "",
        "#define ROUNDING_RIGHT_SHIFT(x, shift) \\",
        rrs,
        "",
        "#ifdef __cplusplus",
        "#define SAME_TYPE(x) decltype(x)",
        "#else",
        "#define SAME_TYPE(x) typeof(x)",
        "#endif",
        "",
        "#define ROUND_NEAR_EVEN(x) \\",
        "    ({ const SAME_TYPE(x) x_ = (x); \\",
        "         const long long i = x_; \\",
        "         const long long next = x_ < 0 ? x_ - 1 : x_ + 1; \\",
        "         SAME_TYPE(x) rem = x_ - i; \\",
        "         rem = rem < 0 ? -rem : rem; \\",
        "         SAME_TYPE(x) result = rem < 0.5 ? i : (rem > 0.5 ? next : (i % 2 == 0 ? i : next)); \\",
        "         result; })",
        "",
        "#define ROUNDING_RIGHT_SHIFT_BITS(x, shift) \\",
        rrs,
        "",
        "#define ACC_SCALE(x, scale) \\",
        f"    ({{float y = ROUND_NEAR_EVEN((x) * (scale)); y > INT{in_bits}_MAX ? INT{in_bits}_MAX : "
        f"(y < INT{in_bits}_MIN ? INT{in_bits}_MIN : (acc_t)y);}})",
        "",
        "#define MVIN_SCALE(x, scale) \\",
        f"    ({{float y = ROUND_NEAR_EVEN((x) * (scale)); y > INT{in_bits}_MAX ? INT{in_bits}_MAX : "
        f"(y < INT{in_bits}_MIN ? INT{in_bits}_MIN : (elem_t)y);}})",
        "",
        "#define MVIN_SCALE_ACC(x, scale) (x)",
        "",
        "#define ACC_SCALE_T_IS_FLOAT",
        "#define ACC_SCALE_EXP_BITS 8",
        "#define ACC_SCALE_SIG_BITS 24",
        "",
    ]
    if args["acc_read_small_width"]:
        lines.append("#define ACC_READ_SMALL_WIDTH")
    if args["acc_read_full_width"]:
        lines.append("#define ACC_READ_FULL_WIDTH")
    lines.append("")
    if args["has_first_layer_optimizations"]:
        lines += ["#define HAS_FIRST_LAYER_OPTIMIZATIONS", ""]
    if args["has_normalizations"]:
        lines += ["#define HAS_NORMALIZATIONS", "#define NORM_STAT_IDS 2", ""]
    lines.append("#endif // GEMMINI_PARAMS_H")
    return "\n".join(lines) + "\n"
