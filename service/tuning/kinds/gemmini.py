"""`gemmini` jobs: BACO hardware/mapping co-tuning for a Gemmini accelerator over a list of layers.

The distribution's points are the layers (GEMM/GEMV as `dense`, or `conv2d`) and their weights the
occurrence counts, so one point is a single operator and many points a network. The whole list is one
unit: hardware is shared, so it is co-tuned once for the occurrence-weighted EDP (budget.trials = model calls),
with the worker's backend in the loop (tuners/gemmini/cotune.py): a search on the analytical model, a second
on the model calibrated to the backend, and the backend's pick among both rounds' best configs and
Gemmini-Default as gemmini.h tiles it. Every measurement is reported with the backend's name; the calibration
and the model's correlation with that backend are stored with the result. A backend bound to built hardware
(FireSim bitstreams) tunes mappings on those configs under the model, and the backend picks among them.

A killed attempt leaves nothing half-counted: the unit records its candidates once, when it ends, and a retry
runs it again from the start; the search is seeded, so it chooses the same hardware again (unlike `sketch` and
`pipeline`, whose units record each measurement as it comes and resume from them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from service.models import Budget, TargetSpec, WorkloadSpec, shape_key
from service.models.config import GemminiCotuneConfig, MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning.kinds.base import JobKind, Plan, Problem, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.platforms.base import VendorTiming

MAX_LAYERS = 128


class GemminiKind(JobKind):
    name = "gemmini"
    summary = "BACO co-tuning of Gemmini hardware and per-layer tiling for a layer list's EDP"
    target_kinds: ClassVar[frozenset[str]] = frozenset({"gemmini"})
    config_schema: ClassVar[type[BaseModel] | None] = GemminiCotuneConfig
    publishes = "configs"
    default_trials = 3000
    saturates_after = 1

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
    ) -> Problem | None:
        if workload.op not in ("dense", "conv2d"):
            return Problem(("workload", "op"), "gemmini jobs tune dense (GEMM/GEMV, no bias) and conv2d layers")
        if workload.attrs.get("bias"):
            return Problem(("workload", "attrs", "bias"), "gemmini jobs tune dense layers without bias")
        if workload.attrs.get("activation", "none") != "none":
            return Problem(("workload", "attrs", "activation"), "gemmini jobs tune dense layers without an activation")
        if len(distribution.support()) > MAX_LAYERS:
            return Problem(("distribution",), f"gemmini jobs co-tune at most {MAX_LAYERS} distinct layers")
        if budget.trials < 50:
            return Problem(("budget", "trials"), "gemmini jobs need at least 50 model evaluations")
        return None

    def check_config(self, config: Mapping[str, Any]) -> Problem | None:
        """The schema, then the hardware: a config Gemmini's generator would refuse (legality.py) is not a
        gemmini config, whoever sends it; the loc names the hw field the first failed rule is about."""
        problem = super().check_config(config)
        if problem is not None:
            return problem
        from service.tuning.gemmini.legality import field_violations
        from service.tuning.gemmini.space import HwConfig

        hw = dict(config["hw"])
        try:
            cfg = HwConfig(**hw)
            if not all(isinstance(v, int) and not isinstance(v, bool) for k, v in hw.items() if k != "dataflow"):
                raise TypeError("the hw sizes must be integers")
        except TypeError as exc:
            return Problem(("hw",), f"not a Gemmini hardware config: {exc}")
        if cfg.dataflow not in ("WS", "OS", "BOTH"):
            return Problem(("hw", "dataflow"), f"dataflow {cfg.dataflow!r} is not one of WS, OS, BOTH")
        bad = field_violations(cfg)
        if bad:
            return Problem(("hw", bad[0][0]), f"Gemmini cannot generate this config: {bad[0][1]}")
        flow = config.get("dataflow")
        if flow is not None and flow not in cfg.flows_for(str(config.get("op", "gemm"))):
            return Problem(("dataflow",), f"a {cfg.dataflow} array does not run this layer with {flow!r}")
        return None

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        support = distribution.support()
        shapes = [PlannedShape(shape=s, weight=w, priority=w * workload.flops(s), trials=1) for s, w in support]
        unit = WorkUnit("network", tuple(shape_key(p.shape) for p in shapes), int(budget.trials))
        # progress: the model calls of the search, then each layer measured on the chosen and the default config
        return Plan(shapes=shapes, units=[unit], trials_total=unit.trials + 2 * len(shapes))

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        from service.tuning.gemmini.backends import BackendError
        from service.tuning.gemmini.gemmini_h import default_point
        from service.tuning.gemmini.model import network_cost
        from service.tuning.gemmini.space import DEFAULT_HW
        from service.tuning.gemmini.workloads import CLOCK_HZ, layer_of
        from service.tuning.tuners.base import TuningStopped
        from service.tuning.tuners.gemmini.backend_pick import (
            SHORTLIST,
            measure_shortlist,
            measured,
            network_edp,
            ranked,
        )
        from service.tuning.tuners.gemmini.best_flow import default_options, measured_best
        from service.tuning.tuners.gemmini.calibration import correlate
        from service.tuning.tuners.gemmini.cotune import cotune
        from service.tuning.tuners.gemmini.tuner import BacoTask, BacoTuner

        backend = ctx.platform.backend  # type: ignore[attr-defined]
        support = ctx.distribution.support()
        layers = [layer_of(ctx.workload, s, w, shape_key(s)) for s, w in support]
        # a backend bound to built hardware (FireSim bitstreams) tunes mappings on those configs only
        choices = backend.hardware_choices()
        seed = ctx.budget.seed or 0
        fitted = None
        default_maps, _ = default_point(layers)
        base: list[Any] = []
        try:
            if choices is None:
                # one objective: the model searches, calibrated to this backend where round 1's answers were
                # measured, and the backend picks the winner among both rounds' shortlists and the default
                co = cotune(backend, layers, unit.trials, seed)
                result, shortlist, fitted, model_calls = co.first, co.candidates, co.calibration, co.model_calls
                default_maps, base = co.start.mappings, co.start.measurements
            else:
                result = BacoTuner().tune(BacoTask(layers, unit.trials, seed, choices), ctx.sink)
                model_calls = result.calls
                shortlist = measure_shortlist(backend, layers, result.shortlist(layers, SHORTLIST))
                if DEFAULT_HW in choices:  # the default as gemmini.h tiles it is a candidate: never worse than it
                    default_maps, base = measured_best(backend, DEFAULT_HW, layers, default_options(DEFAULT_HW, layers))
                    shortlist = ranked(layers, [*shortlist, measured(DEFAULT_HW, layers, default_maps, base)])
        except RuntimeError as exc:
            return UnitResult(fatal=f"{backend.name}: {exc}")
        except (BackendError, ValueError) as exc:
            return UnitResult(fatal=f"{backend.name} could not measure: {exc}")
        # the search's budget is spent (it may stop a little early); the explored configs recorded below are
        # part of it (each cost at least one model call), so they count once, as candidates
        explored = explored_candidates(result.explored, len(layers))
        ctx.sink.on_progress(None, max(0, unit.trials - len(explored)))
        if ctx.sink.should_stop():
            raise TuningStopped("stopped by the job")
        winner = shortlist[0]
        tuned_maps, tuned = winner.mappings, winner.measurements
        tuned_model, default_model = (
            network_cost(winner.hw, layers, tuned_maps),
            network_cost(DEFAULT_HW, layers, default_maps),
        )
        model_cycles = [c.cycles for c in tuned_model.layers] + [c.cycles for c in default_model.layers][: len(base)]
        calibration = correlate(model_cycles, [m.cycles for m in tuned + base], backend.name)
        if fitted is not None:  # what round 2 optimised: the model's energy terms and cycles refitted
            calibration["objective"] = {**fitted.to_dict(), "points": sum(f.n for f in fitted.fits.values())}

        tuned_edp, base_edp = winner.measured_edp, network_edp(layers, base) if base else None
        spike_check = spike_provenance(winner.hw, tuned_maps, default_maps if base else None, layers)
        hw = winner.hw.to_dict()
        candidates = []
        outcomes = []
        if not base:  # the default config has no bitstream: nothing to compare with, progress still counts it
            ctx.sink.on_progress(None, len(layers))
        base_rows: list[Any] = list(base) or [None] * len(layers)
        rows = zip(support, layers, tuned_maps, tuned, base_rows, tuned_model.layers, strict=True)
        for k, ((shape, _), lay, m, mt, mb, model) in enumerate(rows):  # one row per layer
            config = {
                "format": "gemmini-cotune",
                "layer": lay.label,
                "backend": mt.backend,
                "hw": hw,
                "generator_config": winner.hw.generator_config(),
                "mapping": m.to_dict(),
                "op": lay.op,
                "dataflow": m.flow,  # the layer's own: a BOTH array picks WS or OS per layer
                "loop_order": "gemmini.h fixed",
                "measured_cycles": mt.cycles,
                "measured_energy_pj": mt.energy_pj,
                "model_cycles": model.cycles,
                "model_energy_pj": model.energy_pj,
            }
            # the dashboard's latency/energy scatter marks these two roles
            candidates.append(
                MeasuredCandidate(config={**config, "role": "chosen"}, latency_s=mt.cycles / CLOCK_HZ, status="ok")
            )
            vendor = None
            if mb is not None:
                default_config = {
                    **config,
                    "role": "default",
                    "hw": DEFAULT_HW.to_dict(),
                    "generator_config": DEFAULT_HW.generator_config(),
                    "mapping": default_maps[k].to_dict(),
                    "dataflow": default_maps[k].flow,
                    "loop_order": "gemmini.h fixed (tiled_matmul_auto / tiled_conv_auto tiling), each layer in the "
                    "dataflow the backend measured fastest",
                    "measured_cycles": mb.cycles,
                    "measured_energy_pj": mb.energy_pj,
                    "model_cycles": default_model.layers[k].cycles,
                    "model_energy_pj": default_model.layers[k].energy_pj,
                }
                candidates.append(MeasuredCandidate(config=default_config, latency_s=mb.cycles / CLOCK_HZ, status="ok"))
                vendor = VendorTiming(
                    f"Gemmini default 16x16 256/64 KiB, gemmini.h tiling, {default_maps[k].flow} (its best dataflow "
                    f"by {mb.backend}): {mb.cycles:.0f} cycles",
                    mb.cycles / CLOCK_HZ,
                )
            outcome = ShapeOutcome(
                shape=dict(shape),
                latency_s=mt.cycles / CLOCK_HZ,
                vendor=vendor,
                config=config,
                config_latency_s=model.cycles / CLOCK_HZ,
                provenance={
                    "tuner": "gemmini-baco",
                    "backend": backend.name,
                    "model_calls": model_calls,
                    "hardware_choices": "any" if choices is None else len(choices),
                    "importance_units": dict(zip([x.name for x in layers], result.allocation, strict=False)),
                    "network_edp": {"tuned": tuned_edp, "default": base_edp, "backend": backend.name},
                    # the model's best configs as this backend measured them; the first is the winner
                    "shortlist": [m.to_dict() for m in shortlist],
                    "calibration": calibration,
                    "spike": spike_check,
                },
            )
            if ctx.settings.publish_only_faster_than_vendor and tuned_edp and base_edp and tuned_edp >= base_edp:
                outcome.not_published = "the co-tuned network's measured EDP does not beat Gemmini-Default"
            outcomes.append(outcome)
        candidates += explored
        ctx.sink.on_candidates(unit.key, candidates)
        return UnitResult(shapes=outcomes)


def spike_provenance(
    hw: Any, tuned_maps: list[Any], default_maps: list[Any] | None, layers: list[Any]
) -> dict[str, Any]:
    """The winner's (and the measured default's) generated program run under Spike with libgemmini built for
    its config: functional correctness only, never timing (backends/spike.py). Where the tools are absent or a
    step fails it says "not run: <why>" and the job goes on: Spike is a check, not a measurement."""
    from service.tuning.gemmini.backends.spike import verdict
    from service.tuning.gemmini.space import DEFAULT_HW

    out = {"winner": verdict(hw, layers, tuned_maps)}
    if default_maps is not None:
        out["default"] = verdict(DEFAULT_HW, layers, default_maps)
    return out


MAX_EXPLORED_RECORDED = 200  # the lowest-EDP hardware configs of a search; enough to show its frontier


def explored_candidates(explored: Mapping[Any, Any], n_layers: int) -> list[MeasuredCandidate]:
    """The hardware configs the search visited, each at its best network point, as the analytical model
    scored them (`model_` numbers, never a backend's): the dashboard's latency/energy scatter. With several
    layers they are occurrence-weighted network sums, so they sit apart from the per-layer measured points."""
    from service.tuning.gemmini.workloads import CLOCK_HZ

    best = sorted(explored.items(), key=lambda item: item[1].edp)[:MAX_EXPLORED_RECORDED]
    return [
        MeasuredCandidate(
            config={
                "role": "explored",
                "layer": "network" if n_layers > 1 else "layer",
                "backend": "model",
                "hw": hw.to_dict(),
                "model_cycles": net.cycles,
                "model_energy_pj": net.energy_pj,
            },
            latency_s=net.cycles / CLOCK_HZ,
            status="ok",
        )
        for hw, net in best
    ]
