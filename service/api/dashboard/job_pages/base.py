"""The `JobPage` interface: the charts and tables of one job kind's page on the dashboard."""

from __future__ import annotations

from service.api.dashboard import panels as ui


class JobPage:
    """The default page suits any kind: tuning curves, per-shape results against the vendor, every measured
    candidate (described by the kind), errors, and a latency/energy scatter when candidates carry energy.
    A kind's own page overrides `panels` to show what is particular to its algorithm; it runs in the API
    process, so it must not need a compiler."""

    def panels(self, data: ui.JobData, describe: ui.Describe) -> list[ui.Panel]:
        return ui.default_panels(data, describe=describe)
