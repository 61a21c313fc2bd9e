"""Job pages of the dashboard, one module per kind that draws more than the default page, looked up by kind.

Rendering is the dashboard's: a job kind (service.tuning.kinds) only describes its configs
(`JobKind.describe_config`). A plugin kind may register its page here from its plugin module
(`JOB_PAGES.register(name, page)`); a kind without one gets the default page.
"""

from __future__ import annotations

from service.api.dashboard import panels as ui
from service.api.dashboard.job_pages.base import JobPage
from service.registry import Registry
from service.tuning.kinds import KINDS
from service.tuning.kinds.base import summarize_config

JOB_PAGES: Registry[JobPage] = Registry(
    "job page",
    {
        "ukernel": "service.api.dashboard.job_pages.ukernel:UKernelPage",
        "pipeline": "service.api.dashboard.job_pages.pipeline:PipelinePage",
    },
)


def job_panels(data: ui.JobData) -> list[ui.Panel]:
    """The panels of a job's page. A kind this process does not know (a plugin not loaded here) gets the
    default page with configs described generically."""
    name = data.job.kind
    describe = KINDS.get(name).describe_config if name in KINDS.names() else summarize_config
    page = JOB_PAGES.get(name) if name in JOB_PAGES.names() else JobPage()
    return page.panels(data, describe)


__all__ = ["JOB_PAGES", "JobPage", "job_panels"]
