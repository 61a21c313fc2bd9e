// KernelFleet dashboard pages: draw the panels embedded in the page, and keep the jobs list and a running
// job's page live by polling the dashboard's JSON feeds (same-origin, the HttpOnly cookie goes along).
"use strict";

(function () {
  const POLL_MS = 1000;
  const fmt = (v, u) => window.KFCharts.format(v, u);

  function readJson(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function drawPanels(panels) {
    const box = document.getElementById("panels");
    if (!box || !panels) return;
    const scroll = window.scrollY;
    box.replaceChildren();
    for (const p of panels) window.KFCharts.render(box, p);
    window.scrollTo(0, scroll);
  }

  function setLive(ok) {
    const live = document.getElementById("live-status");
    if (!live) return;
    live.textContent = ok ? "live" : "reconnecting…";
    live.classList.toggle("down", !ok);
  }

  async function poll(url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.status === 401) {  // signed out (key revoked or cookie expired): back to the login page
      window.location.assign("/dashboard/login?next=" + encodeURIComponent(window.location.pathname + window.location.search));
      return null;
    }
    if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
    return resp.json();
  }

  function every(ms, step) {
    let stopped = false;
    async function tick() {
      let again = true;
      try { again = (await step()) !== false; setLive(true); } catch (e) { setLive(false); }
      if (again && !stopped) window.setTimeout(tick, ms);
    }
    window.setTimeout(tick, ms);
    return () => { stopped = true; };
  }

  // -- the jobs list -------------------------------------------------------------------------------------
  function jobRow(j) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    tr.dataset.state = j.state;
    const td = (text, cls) => {
      const c = document.createElement("td");
      if (cls) c.className = cls;
      if (text !== undefined) c.textContent = text;
      tr.appendChild(c);
      return c;
    };
    const a = document.createElement("a");
    a.href = "/dashboard/jobs/" + encodeURIComponent(j.id);
    a.textContent = j.id.slice(0, 8);
    td().appendChild(a);
    td(j.kind);
    const st = td(undefined, "state-cell");
    const badge = document.createElement("span");
    badge.className = "state";
    badge.dataset.state = j.state;
    badge.textContent = j.waiting_for_worker ? `${j.state} (no worker)` : j.state;
    if (j.error) badge.title = j.error;
    st.appendChild(badge);
    const pc = td(undefined, "progress-cell");
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = j.progress;
    pc.appendChild(bar);
    const txt = document.createElement("span");
    txt.className = "trials";
    txt.textContent = ` ${j.trials_done}/${j.trials_total}`;
    pc.appendChild(txt);
    td(j.workload);
    td(j.target);
    td(j.created_at.replace("T", " ").slice(0, 19));
    return tr;
  }

  function drawJobs(listing) {
    const body = document.getElementById("jobs-body");
    body.replaceChildren(...listing.jobs.map(jobRow));
    document.getElementById("job-count").textContent = String(listing.total);
    document.getElementById("jobs-empty").hidden = listing.jobs.length > 0;
    document.getElementById("jobs-pager-range").textContent = listing.range;
    const older = document.getElementById("jobs-pager-older");  // absent past the last offset a page may ask for
    if (older) older.hidden = !listing.more;
  }

  function jobsPage() {
    drawJobs(readJson("jobs-data"));
    const feed = "/dashboard/api/jobs" + window.location.search;
    every(2 * POLL_MS, async () => {
      const listing = await poll(feed);
      if (listing) drawJobs(listing);
    });
  }

  // -- a job ---------------------------------------------------------------------------------------------
  function jobPage(jobId) {
    drawPanels(readJson("panels-data"));
    let shown = document.body.dataset.version || "";  // the version of the panels on screen
    every(POLL_MS, async () => {
      const feed = await poll(`/dashboard/api/jobs/${encodeURIComponent(jobId)}?known=${encodeURIComponent(shown)}`);
      if (!feed) return false;
      const j = feed.job;
      const state = document.getElementById("job-state");
      state.textContent = j.state;
      state.dataset.state = j.state;
      document.getElementById("job-progress").value = j.progress;
      document.getElementById("job-trials").textContent = `${j.trials_done}/${j.trials_total}`;
      document.getElementById("job-candidates").textContent = String(feed.candidates_total);
      document.getElementById("job-worker").textContent = `${j.worker || "–"} (attempt ${j.attempts})`;
      const err = document.getElementById("job-error");
      err.hidden = !j.error;
      err.textContent = j.error || "";
      document.getElementById("job-waiting").hidden = !j.waiting_for_worker;
      document.getElementById("job-published").textContent = j.publication;
      if (j.done) {
        const cancel = document.getElementById("cancel-form");
        if (cancel) cancel.remove();
      }
      // the feed sends panels only when something they show changed
      if (feed.panels) { drawPanels(feed.panels); shown = feed.version; }
      return !j.done;  // a finished job changes no more
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    if (page === "jobs" && document.body.dataset.job) jobPage(document.body.dataset.job);
    else if (page === "jobs" && document.getElementById("jobs-body")) jobsPage();
    else drawPanels(readJson("panels-data"));
  });
})();
