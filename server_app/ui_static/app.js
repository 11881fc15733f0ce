"use strict";
// The operator page: reads /ui/api/jobs with the operator's bearer token and draws each job.
// Every value goes into the page as text (textContent), never as markup.
(function () {
  const KEY = "fedforest-operator-token";
  // ms from an answer (or a read given up) to the next read
  const EVERY_MS = 3000;
  // ms a read may take before it is given up and the page says the server does not answer
  const TIMEOUT_MS = 30000;
  let reading = false;  // a read is in flight: the page never has two at once
  let next = null;  // the timer of the next read
  let newToken = false;  // a token entered during a read: read with it once that read ends

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function eta(s) {
    if (s === null || s === undefined) return "unknown yet";
    if (s < 90) return "about " + Math.round(s) + " s";
    if (s < 5400) return "about " + Math.round(s / 60) + " min";
    return "about " + (s / 3600).toFixed(1) + " h";
  }

  function jobSection(job) {
    const level = job.level === null ? "-" : job.level + " of " + job.max_depth;
    const section = el("section", {class: "job", "data-job": job.job_id},
      el("h2", {}, job.job_id + " ",
         el("span", {class: "status status-" + job.status}, job.status)));
    const facts = el("table", {class: "facts"});
    const rows = [
      ["profile", job.profile || "-"],
      job.kind === "evaluate" ? ["kind", "evaluation (one round)"] : ["level", level],
      ["round", job.round_id < 0 ? "-" : job.round_id],
      ["phase", job.phase || "-"],
      ["rounds done", job.rounds_done],
      ["members", job.joined_clients + " of " + job.n_clients + " joined, " +
                  job.active_clients + " active, " + job.dropped_clients + " dropped" +
                  " (at least " + job.min_clients + " needed)"],
    ];
    if (job.status === "running") {
      const hasOverrun = job.overrun_s !== null && job.overrun_s !== undefined;
      const hasDeadline = job.deadline_in_s !== null && job.deadline_in_s !== undefined;
      // a site stalls the level: how long it overran, not an ETA that floors at "about 1 s"
      const open = job.level === null ? "the open level" : "level " + job.level;
      rows.push(["ETA", hasOverrun ? "none while " + open + " waits: it has run " +
                 Math.round(job.overrun_s) + " s longer than the levels before it took each"
                 : eta(job.eta_s)]);
      if (hasDeadline && (job.eta_s === null || job.eta_s === undefined)) {
        const phase = job.phase ? "phase " + job.phase : "the open phase";
        rows.push(["deadline", job.deadline_in_s > 0
          ? phase + " closes in " + eta(job.deadline_in_s) + " at the latest; the sites " +
            "that have not answered it by then are dropped"
          : phase + "'s deadline has passed; the sites that have not answered it are " +
            "dropped at the server's next step"]);
      }
    }
    if (job.reason) rows.push(["reason", job.reason]);
    for (const [k, v] of rows) facts.append(el("tr", {"data-fact": k}, el("th", {}, k), el("td", {}, v)));
    const audit = job.audit;
    const auditText = !audit.kept ? "none kept (the server has no audit_database)"
                    : audit.ok ? "verifies (" + audit.entries + " entries)"
                    : "DOES NOT VERIFY: " + audit.problems.join("; ");
    const auditClass = !audit.kept ? "audit-none" : audit.ok ? "audit-ok" : "audit-bad";
    facts.append(el("tr", {"data-fact": "audit"}, el("th", {}, "audit chain"),
                    el("td", {class: auditClass}, auditText)));
    section.append(facts);
    const members = el("table", {class: "members"},
      el("tr", {}, el("th", {}, "#"), el("th", {}, "site"), el("th", {}, "state")));
    for (const m of job.members) {
      const state = m.state + (m.state === "dropped" && m.dropped_round !== null
                               ? " at round " + m.dropped_round : "")
                            + (m.declined ? " (declined: " + m.declined + ")" : "")
                            + (m.revoked ? " (revoked: it cannot join until " +
                               "`fedforest server rotate-token " + m.name + "`)" : "");
      members.append(el("tr", {class: "member state-" + m.state, "data-member": m.name},
                        el("td", {}, m.index), el("td", {}, m.name), el("td", {}, state)));
    }
    section.append(members);
    return section;
  }

  async function refresh() {
    const token = sessionStorage.getItem(KEY);
    const message = document.getElementById("message");
    if (!token) return;
    const abort = new AbortController();
    const timer = setTimeout(function () { abort.abort(); }, TIMEOUT_MS);
    let resp;
    let body = null;
    try {
      resp = await fetch("/ui/api/jobs", {headers: {"Authorization": "Bearer " + token},
                                          cache: "no-store", signal: abort.signal});
      try {
        body = await resp.json();
      } catch (err) {
        if (abort.signal.aborted) throw err;
        body = null;  // not JSON: an error page of something in between
      }
    } catch (err) {
      if (sessionStorage.getItem(KEY) === token) {
        message.textContent = abort.signal.aborted
          ? "the server does not answer (nothing within " + TIMEOUT_MS / 1000 + " s)"
          : "the server does not answer";
      }
      return;
    } finally {
      clearTimeout(timer);
    }
    // another token was entered meanwhile: this answer is not for it (its read comes next)
    if (sessionStorage.getItem(KEY) !== token) return;
    if (resp.status === 401) {  // removed or wrong: what it showed is no longer for this page
      sessionStorage.removeItem(KEY);
      message.textContent = "unknown operator token";
      document.getElementById("jobs").replaceChildren();
      document.getElementById("server").textContent = "";
      return;
    }
    if (!resp.ok || body === null || !Array.isArray(body.jobs)) {
      // what the page shows stays, marked as out of date: the server says why it failed
      const why = body !== null && typeof body.detail === "string" ? body.detail
        : "HTTP " + resp.status;
      message.textContent = "the server failed (" + why + "); the jobs below are from " +
        "the last answer";
      return;
    }
    message.textContent = "";
    document.getElementById("server").textContent = "server " + body.version + ", " +
      body.jobs.length + " job(s), updated " + new Date().toLocaleTimeString();
    const main = document.getElementById("jobs");
    main.replaceChildren(...body.jobs.map(jobSection));
    if (body.jobs.length === 0) main.append(el("p", {id: "no-jobs"}, "no jobs yet"));
  }

  // one read at a time: the next EVERY_MS after an answer, an error or a read given up
  async function poll() {
    next = null;
    reading = true;
    try {
      await refresh();
    } finally {
      reading = false;
      const now = newToken;
      newToken = false;
      next = setTimeout(poll, now ? 0 : EVERY_MS);
    }
  }

  // a token entered, or the page opened with one: read now, or once the read in flight ends
  function start() {
    if (reading) {
      newToken = true;
      return;
    }
    if (next !== null) clearTimeout(next);
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("login").addEventListener("submit", function (ev) {
      ev.preventDefault();
      sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
      document.getElementById("token").value = "";
      start();
    });
    if (sessionStorage.getItem(KEY)) start();
  });
})();
