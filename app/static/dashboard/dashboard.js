// The operators' page: log in, poll /dashboard/api/overview, draw, act.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "vidrec.dashboard.key", NAME = "vidrec.dashboard.operator";
  const KEEP_MS = 30 * 60 * 1000;  // chart history kept in the page
  let refreshMs = 2000, timer = null, role = null, busy = false, stale = false, rollbackTarget = null;
  const hist = { training: [], serving: [], retrain: {} };
  let since = { training: 0, serving: 0 };
  let heads = [];  // the other ranking heads (the training view's "heads")

  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (v, digits = 3) => (v === null || v === undefined || !isFinite(v)) ? "–" : Number(v).toFixed(digits);
  const int = (v) => (v === null || v === undefined) ? "–" : Number(v).toLocaleString("en-US");
  const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + "%";
  const when = (ms) => ms ? new Date(ms).toLocaleString("en-GB", { hour12: false }) : "–";
  const bytes = (b) => b >= 1 << 20 ? (b / (1 << 20)).toFixed(1) + " MiB" : b >= 1024 ? (b / 1024).toFixed(1) + " KiB" : b + " B";

  function headers() {
    const h = { "X-API-Key": sessionStorage.getItem(KEY) || "", "Content-Type": "application/json" };
    const name = sessionStorage.getItem(NAME); if (name) h["X-Operator"] = name;
    return h;
  }

  async function api(path, options = {}) {
    const res = await fetch(path, { ...options, headers: headers() });
    let body = null; try { body = await res.json(); } catch (e) { body = null; }
    if (res.status === 401) { logout(body && body.message ? "Key refused: " + body.message : "Key refused"); throw new Error("unauthorized"); }
    if (!res.ok) throw new Error((body && body.message) || res.statusText);
    return body;
  }

  // --- login -------------------------------------------------------------
  function logout(message) {
    sessionStorage.removeItem(KEY);
    role = null; if (timer) clearInterval(timer); timer = null;
    $("main").hidden = true; $("login").hidden = false; $("logout").hidden = true; $("who").textContent = "";
    $("login-error").textContent = message || "";
  }

  async function login() {
    const s = await api("/dashboard/api/session");
    role = s.role; refreshMs = s.refresh_ms || 2000;
    document.body.classList.toggle("viewer", role !== "admin");
    $("who").textContent = `${s.name} · ${role}`; $("logout").hidden = false;
    $("login").hidden = true; $("main").hidden = false; $("login-error").textContent = "";
    await refresh();
    timer = setInterval(refresh, refreshMs);
  }

  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("key").value);
    sessionStorage.setItem(NAME, $("operator").value.trim());
    try { await login(); } catch (e) { if (e.message !== "unauthorized") $("login-error").textContent = e.message; }
  });
  $("logout").addEventListener("click", () => logout(""));

  // --- rendering ---------------------------------------------------------
  // A tile takes two columns when its value would not fit one (ids, "a / pop. b"),
  // and wraps at spaces past that: a figure is never cut off.
  function kpis(el, items) {
    el.innerHTML = items.map(([label, value, id]) => {
      const n = String(value).length, span = n > 9 ? " span2" : "", long = n > 18 ? " long" : "";
      return `<div class="kpi${span}"><div class="label">${esc(label)}</div><div class="value${long}" ${id ? `id="${id}"` : ""}>${esc(value)}</div></div>`;
    }).join("");
  }

  function table(el, head, rows) {
    el.innerHTML = `<thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody>${rows.join("")}</tbody>`;
  }

  function trim(list) { const cut = Date.now() - KEEP_MS; while (list.length && list[0].ts_ms < cut) list.shift(); }

  function renderTraining(t) {
    $("training-error").textContent = t.error || "";
    if (t.error) return;
    const state = t.state, l = t.latest || {};
    heads = t.heads || heads;  // before the KPIs: they show one figure per head
    const badge = $("trainer-state"); badge.textContent = "trainer: " + state; badge.dataset.state = state;
    kpis($("training-kpis"), [
      ["state", state, "kpi-trainer-state"], ["events/s", num(l.events_per_s, 1)], ["consumer lag", int(l.lag)],
      ["batch ms (mean / p95)", `${num(l.batch_ms_mean, 1)} / ${num(l.batch_ms_p95, 1)}`],
      ["unique keys / batch", int(l.unique_keys)], ["dead letters", int(t.dead_letters)],
      ["last checkpoint", t.checkpoint_seq ? "#" + t.checkpoint_seq + (t.checkpoint_seen_ms ? ` · ${Math.round((Date.now() - t.checkpoint_seen_ms) / 1000)} s ago` : "") : "–"], ["events trained", int(l.events_total)],
      ["AUC", num(l.auc)], ["popularity AUC", num(l.baseline_auc)],
      ["log loss", num(l.logloss)], ["popularity log loss", num(l.baseline_logloss)],
      ...headKpis(l),
      ["last export", t.last_version || "–"],
      ["served-log join", joinText(t.served_join), "kpi-served-join"],
      ["sequence tower", sequenceText(t.sequence), "kpi-sequence"],
      ["live factorisation", factorsText(t.sequence), "kpi-factorization"],
    ]);
    for (const p of t.points || []) if (p.ts_ms > since.training) { hist.training.push(p); since.training = p.ts_ms; }
    trim(hist.training);
    const lag = t.lag_per_partition || {};
    table($("lag-table"), ["partition", "lag"], Object.entries(lag).map(([p, v]) => `<tr><td>${esc(p)}</td><td>${int(v)}</td></tr>`));
    drawTraining();
  }

  function sequenceText(q) {
    if (!q) return "off";
    return `${int(q.fits)} refits · weight ${num(q.weight, 2)}`;
  }

  function factorsText(q) {
    const f = q && q.factorization;
    if (!f) return "off";
    const failed = f.failed ? ` · ${int(f.failed)} failed` : "";
    return `${int(f.fits)} fits (${int(f.fitted_pairs)} pairs, last ${num(f.last_fit_seconds, 2)} s) · ${int(f.users_folded)} users folded${failed}`;
  }

  // The other ranking heads as the server lists them (feature_store/heads.py): each one's
  // figures in a metrics point, main figure and popularity baseline first.
  const METRIC_TEXT = { auc: "AUC", rank: "rank corr. (MAE)" };
  function headKpis(l) {
    return heads.map((h) => {
      const [main, base, mae] = h.figures;
      const extra = h.metric === "rank" ? ` (${num(l[mae])})` : "";
      return [`${h.about} ${METRIC_TEXT[h.metric] || h.metric}`, `${num(l[main])}${extra} / pop. ${num(l[base])}`, "kpi-" + main.replace(/_/g, "-")];
    });
  }

  // Events naming a recommendation, by what the trainer's join made of them (trainer/served.py).
  function joinText(j) {
    if (!j) return "–";
    const named = ["joined", "missing", "late", "unknown", "other_schema"].reduce((n, k) => n + (j[k] || 0), 0);
    if (!named) return "no events named a recommendation yet";
    return `${pct(j.joined / named)} joined · ${int(j.missing)} missing · ${int(j.late)} late · ${int(j.unknown)} unknown` +
      (j.other_schema ? ` · ${int(j.other_schema)} other schema` : "");
  }

  function series(list, field) { return list.map((p) => [p.ts_ms, p[field]]); }

  function drawTraining() {
    const h = hist.training;
    const auc = [{ label: "model", points: series(h, "auc") }, { label: "popularity", points: series(h, "baseline_auc"), dash: true }];
    const loss = [{ label: "model", points: series(h, "logloss") }, { label: "popularity", points: series(h, "baseline_logloss"), dash: true }];
    Object.entries(hist.retrain).forEach(([id, pts], i) => {
      const color = Charts.COLORS[(i + 2) % Charts.COLORS.length];
      auc.push({ label: "retrain " + id, points: series(pts, "auc"), color });
      loss.push({ label: "retrain " + id, points: series(pts, "logloss"), color });
    });
    Charts.draw($("chart-auc"), auc);
    Charts.draw($("chart-logloss"), loss);
    Charts.draw($("chart-heads"), heads.flatMap((head, i) => {
      const color = Charts.COLORS[(3 * i) % Charts.COLORS.length], [main, base] = head.figures;
      return [
        { label: `${head.name} ${head.metric === "rank" ? "rank corr." : "AUC"}`, points: series(h, main), color },
        { label: head.name + ", popularity", points: series(h, base), color, dash: true },
      ];
    }));
    Charts.draw($("chart-throughput"), [{ label: "events/s", points: series(h, "events_per_s") }, { label: "lag", points: series(h, "lag"), color: "#d97706" }], { min: 0 });
  }

  function renderRetrains(list) {
    const rows = (list || []).map((r) => {
      const pts = hist.retrain[r.id] = hist.retrain[r.id] || [];
      for (const p of r.points || []) if (!pts.length || p.ts_ms > pts[pts.length - 1].ts_ms) pts.push(p);
      trim(pts);
      const l = r.latest || {};
      const stop = role === "admin" && ["running", "paused", "starting"].includes(r.state)
        ? `<button class="small ghost" data-retrain-stop="${esc(r.id)}">Stop</button>` : "";
      return `<tr data-retrain="${esc(r.id)}"><td>${esc(r.id)}</td><td>${esc(r.state)}</td><td>${r.from_ts_ms === 0 ? "log start" : when(r.from_ts_ms)}</td><td>${int(l.events_total)}</td><td>${int(l.lag)}</td><td>${num(l.auc)}</td><td>${num(l.logloss)}</td><td>${esc(r.last_version || "–")}</td><td>${stop}</td></tr>`;
    });
    table($("retrain-table"), ["family", "state", "from", "events", "lag", "AUC", "log loss", "last export", ""], rows);
  }

  function topReason(counts) {
    const top = Object.entries(counts || {}).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1])[0];
    return top ? ` (mostly ${top[0]})` : "";
  }

  function ago(seconds) {
    if (seconds == null) return "–";
    if (seconds < 120) return `${Math.round(seconds)} s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  }

  function indexText(ix) {
    if (!ix || !ix.kind) return "none";
    return `${ix.kind}, ${int(ix.size)} videos, ${ago(ix.age_s)} old${ix.rebuilding ? ", rebuilding" : ""}`;
  }

  function renderServing(s) {
    $("serving-error").textContent = s.error || s.load_error || "";
    if (s.error) return;
    const l = s.latest || {};
    $("served-version").textContent = "model: " + (s.version || "none");
    $("provider").textContent = "provider: " + (s.provider || "–");
    kpis($("serving-kpis"), [
      ["requests/s", num(l.requests_per_s, 1)], ["events/s received", num(l.events_per_s, 1)],
      [`fallback rate${topReason(l.fallbacks)}`, pct(l.fallback_rate)], ["degraded rate", pct(l.degraded_rate)],
      ["execution provider", (s.provider || "–").replace("ExecutionProvider", ""), "kpi-provider"],
      ["active model", s.version || "none", "kpi-served-version"],
      ["retrieval index", indexText(s.index), "kpi-index"],
      ...(s.demo ? [["demo: favourite categories (popularity)", `${pct(s.demo.favourite_share)} (${pct(s.demo.popular_favourite_share)})`, "kpi-demo-personal"],
                    ["demo: play rate", pct(s.demo.play_rate)]] : []),
    ]);
    table($("stage-table"), ["stage", "p50 ms", "p99 ms"], (s.stages || []).map((r) =>
      `<tr><td>${esc(r.stage === "onnx" ? "score (onnx)" : r.stage)}</td><td>${num(r.p50_ms, 2)}</td><td>${num(r.p99_ms, 2)}</td></tr>`));
    for (const p of s.points || []) if (p.ts_ms > since.serving) { hist.serving.push(p); since.serving = p.ts_ms; }
    trim(hist.serving);
    const h = hist.serving;
    Charts.draw($("chart-requests"), [{ label: "requests/s", points: series(h, "requests_per_s") }, { label: "events/s", points: series(h, "events_per_s"), color: "#16a34a" }], { min: 0 });
    Charts.draw($("chart-latency"), [{ label: "p50", points: series(h, "p50_total_ms") }, { label: "p99", points: series(h, "p99_total_ms"), color: "#dc2626" }], { min: 0 });
  }

  function renderModels(m) {
    $("models-error").textContent = m.error || "";
    if (m.error) return;
    const rows = (m.versions || []).map((v) => {
      const tags = (v.active ? '<span class="tag active">active</span>' : "") + (v.served ? '<span class="tag served">served</span>' : "")
        + (v.rollback_target ? '<span class="tag rollback">previous</span>' : "");
      const promote = role === "admin" && !v.active ? `<button class="small" data-promote="${esc(v.version)}">Promote</button>` : "";
      const mt = v.metrics || {};
      const pos = Object.entries(v.positions || {}).map(([p, o]) => `p${p}@${o}`).join(" ");
      return `<tr data-version="${esc(v.version)}" data-active="${v.active}"><td>${esc(v.version)}</td><td>${esc(v.family)}</td><td>${when(v.created_at_ms)}</td><td>${int(v.events_total)}</td><td class="hint">${esc(pos || "–")}</td><td>${num(mt.auc)}</td><td>${num(mt.logloss)}</td><td>${num(mt.baseline_auc)}</td><td>${tags}</td><td>${promote}</td></tr>`;
    });
    table($("versions-table"), ["version", "family", "created", "events trained", "log position", "AUC", "log loss", "baseline AUC", "", ""], rows);
    rollbackTarget = m.rollback_target || null;
    $("btn-rollback").disabled = !rollbackTarget;
  }

  function renderTables(t) {
    $("tables-error").textContent = t.error || "";
    const rows = Object.entries(t.tables || {}).map(([name, s]) =>
      `<tr><td>${esc(name)}</td><td>${s.dim}</td><td>${int(s.rows)}</td><td>${int(s.admissions)}</td><td>${int(s.expirations)}</td><td>${bytes(s.bytes)}</td></tr>`);
    table($("tables-table"), ["table", "dim", "rows", "admissions", "expirations", "memory"], rows);
  }

  function renderAudit(a) {
    const rows = (a.entries || []).map((e) => {
      const args = e.version || (e.args && Object.keys(e.args).length ? JSON.stringify(e.args) : "");
      return `<tr data-id="${esc(e.id)}"><td>${when(e.ts_ms)}</td><td>${esc(e.actor)} <span class="hint">${esc(e.role)}</span></td><td>${esc(e.action)}${e.target && e.target !== "live" ? " → " + esc(e.target) : ""} <span class="hint">${esc(args)}</span></td><td class="st-${esc(e.status)}">${esc(e.status)}</td><td>${esc(e.message)}</td></tr>`;
    });
    table($("audit-table"), ["when", "who", "what", "outcome", "message"], rows);
    if (a.error) $("audit-table").insertAdjacentHTML("beforebegin", `<p class="error">${esc(a.error)}</p>`);
  }

  const ci = (f, fmt) => f ? `${fmt(f.value)} <span class="hint">(${fmt(f.low)} – ${fmt(f.high)})</span>` : "–";
  const pp = (v) => (v === null || v === undefined || !isFinite(v)) ? "–" : (100 * v).toFixed(2) + "%";
  const secs = (v) => num(v, 2) + " s";
  const delta = (f, fmt) => f ? `<span class="${f.low > 0 ? "st-done" : f.high < 0 ? "st-failed" : ""}">${ci(f, fmt)}</span>` : "";

  function renderExperiments(x) {
    $("experiments-error").textContent = (x && x.error) || "";
    if (!x) return;
    const r = x.running;
    $("btn-experiment-stop").hidden = !r || role !== "admin";
    $("btn-experiment-stop").dataset.experimentStop = r ? r.id : "";
    const feed = x.feed ? ` · feed: ${int(x.feed.counted)} events counted${x.feed.last_error ? " (" + x.feed.last_error + ")" : ""}` : "";
    $("experiment-summary").textContent = r
      ? `${r.id} · started ${when(r.started_at_ms)} by ${r.started_by} · attribution window ${num((x.window_ms || 0) / 60000, 0)} min${feed}`
      : "No experiment running.";
    const rows = (r ? r.arms : []).map((a) => {
      const d = a.vs_control || {};
      const promote = role === "admin" ? `<button class="small" data-conclude="${esc(a.arm)}" data-experiment="${esc(r.id)}">Promote</button>` : "";
      const version = a.version || (a.unavailable ? `<span class="hint">${esc(a.unavailable)}</span>` : "–");
      return `<tr data-arm="${esc(a.arm)}"><td>${esc(a.arm)}</td><td>${esc(a.family)}</td><td>${version}</td><td>${int(a.impressions)}</td><td>${ci(a.ctr, pp)}</td><td>${delta(d.ctr, pp)}</td><td>${ci(a.finish_rate, pp)}</td><td>${delta(d.finish_rate, pp)}</td><td>${ci(a.watch_s_per_impression, secs)}</td><td>${delta(d.watch_s_per_impression, secs)}</td><td>${promote}</td></tr>`;
    });
    table($("experiment-table"), ["arm", "family", "serving", "impressions", "CTR", "Δ CTR", "finishes / impr.", "Δ", "watch / impr.", "Δ", ""], rows);
    table($("experiment-ended"), ["experiment", "outcome", "ended", "arms"], (x.ended || []).map((e) =>
      `<tr><td>${esc(e.id)}</td><td>${esc(e.status)}${e.winner ? " · " + esc(e.winner) + " won" : ""}</td><td>${when(e.ended_at_ms)}</td><td class="hint">${e.arms.map((a) => `${esc(a.arm)}: ${int(a.impressions)} impr., CTR ${pp(a.ctr && a.ctr.value)}`).join(" · ")}</td></tr>`));
  }

  // A refresh asked for while one is in flight (an action's outcome, say) runs
  // again once it ends: the one in flight may have read the overview before
  // the outcome was written, and would leave the page showing "requested".
  async function refresh() {
    if (!role) return;
    if (busy) { stale = true; return; }
    busy = true; stale = false;
    try {
      const o = await api(`/dashboard/api/overview?since_ms=${Math.min(since.training, since.serving)}`);
      renderTraining(o.training); renderServing(o.serving); renderModels(o.models);
      renderTables(o.tables); renderAudit(o.audit); renderRetrains(o.retrains);
      renderExperiments(o.experiments);
    } catch (e) {
      if (e.message !== "unauthorized") $("training-error").textContent = "refresh failed: " + e.message;
    } finally {
      busy = false;
      if (stale) refresh();
    }
  }

  // --- actions -----------------------------------------------------------
  function confirmAction(text) {
    return new Promise((resolve) => {
      $("confirm-text").textContent = text; $("confirm").hidden = false;
      const done = (ok) => { $("confirm").hidden = true; $("confirm-ok").onclick = $("confirm-cancel").onclick = null; resolve(ok); };
      $("confirm-ok").onclick = () => done(true); $("confirm-cancel").onclick = () => done(false);
      $("confirm-ok").focus();
    });
  }

  function status(cls, text) {
    const el = $("action-status"); el.hidden = false; el.className = "action-status " + cls; el.textContent = text;
  }

  const DESCRIBE = {
    export: () => "Export the live model now and make the new version active?",
    pause: () => "Pause the live trainer? It stops consuming events until resumed.",
    resume: () => "Resume the live trainer?",
    rollback: () => `Roll back to ${rollbackTarget || "the previous model version"}? It undoes the last promotion or export you made (or steps back one version); the service swaps to it at once.`,
    promote: (b) => `Promote ${b.version}? It becomes the active version the service serves.`,
    retrain: (b) => `Start a retrain replaying the event log from ${new Date(b.from_ts_ms).toLocaleString("en-GB")}? A new model family trains beside the live one.`,
    retrain_stop: (b) => `Stop retrain family ${b.target}?`,
    experiment_start: (b) => `Start experiment ${b.experiment.id}? Users are split between ${b.experiment.arms.map((a) => `${a.name} (${a.family})`).join(", ")}.`,
    experiment_stop: (b) => `Stop experiment ${b.experiment} with no winner? Everyone goes back to the active version.`,
    experiment_conclude: (b) => `Promote arm ${b.arm} of ${b.experiment}? Its version becomes active for everyone and the experiment ends.`,
  };

  const TRAINER_ACTIONS = ["export", "pause", "resume", "retrain", "retrain_stop"];

  async function act(action, body = {}) {
    if (role !== "admin") return;
    if (!(await confirmAction(DESCRIBE[action](body)))) return;
    const id = (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random().toString(16).slice(2)).replace(/-/g, "");
    status("requested", `${action}: sent, waiting for an acknowledgement…`);
    let final = false;
    const follow = async () => {
      while (!final) {
        await new Promise((r) => setTimeout(r, 250));
        try {
          const c = await api(`/dashboard/api/commands/${id}`);
          const last = c.acks[c.acks.length - 1];
          if (!final && last && last.status === "accepted") status("accepted", `${action}: accepted by ${last.by}, in progress…`);
        } catch (e) { /* the POST below reports */ }
      }
    };
    if (TRAINER_ACTIONS.includes(action)) follow();
    try {
      const out = await api(`/dashboard/api/actions/${action}`, { method: "POST", body: JSON.stringify({ id, ...body }) });
      final = true;
      status(out.status, `${action}: ${out.status} — ${out.message}`);
    } catch (e) {
      final = true;
      if (e.message !== "unauthorized") status("failed", `${action}: failed — ${e.message}`);
    }
    refresh();
  }

  document.addEventListener("click", (ev) => {
    const t = ev.target.closest("button"); if (!t) return;
    if (t.dataset.action) act(t.dataset.action);
    else if (t.dataset.promote) act("promote", { version: t.dataset.promote });
    else if (t.dataset.retrainStop) act("retrain_stop", { target: t.dataset.retrainStop });
    else if (t.dataset.conclude) act("experiment_conclude", { experiment: t.dataset.experiment, arm: t.dataset.conclude });
    else if (t.id === "btn-experiment-stop" && t.dataset.experimentStop) act("experiment_stop", { experiment: t.dataset.experimentStop });
  });

  $("experiment-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const arms = $("experiment-arms").value.split(",").map((s) => s.trim()).filter(Boolean).map((s) => {
      const [name, rest = ""] = s.split("=");
      const [family, weight] = rest.split(":");
      return weight ? { name: name.trim(), family: family.trim(), weight: Number(weight) } : { name: name.trim(), family: family.trim() };
    });
    act("experiment_start", { experiment: { id: $("experiment-id").value.trim(), arms } });
  });

  $("retrain-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("retrain-from").value; if (!v) return;
    act("retrain", { from_ts_ms: new Date(v).getTime() });
  });

  $("user-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const user = $("user-id").value.trim(); if (!user) return;
    try {
      const u = await api(`/dashboard/api/users/${encodeURIComponent(user)}?count=12`);
      $("user-summary").textContent = `model ${u.model_version || "none"}` + (u.fallback_reason ? ` · fallback: ${u.fallback_reason}` : "") + ` · ${u.history.length} recent actions`;
      table($("user-history"), ["video", "category", "action", "watched", "ago"], u.history.map((h) =>
        `<tr><td>${esc(h.video_id)}</td><td>${esc(h.category)}</td><td>${esc(h.action)}</td><td>${pct(h.watch_ratio)}</td><td>${num(h.age_s, 0)} s</td></tr>`));
      table($("user-recs"), ["video", "category", "source", "score"], u.recommendations.map((r) =>
        `<tr><td>${esc(r.video_id)}</td><td>${esc(r.category)}</td><td><span class="tag">${esc(r.source)}</span></td><td>${num(r.score)}</td></tr>`));
    } catch (e) { if (e.message !== "unauthorized") $("user-summary").textContent = "failed: " + e.message; }
  });

  const d = new Date(Date.now() - 3600e3); d.setMinutes(d.getMinutes() - d.getTimezoneOffset());
  $("retrain-from").value = d.toISOString().slice(0, 19);
  window.addEventListener("resize", () => { if (role) drawTraining(); });

  if (sessionStorage.getItem(KEY)) login().catch(() => {}); else logout("");
})();
