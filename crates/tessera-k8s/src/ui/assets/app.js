// Tessera's mosaic page: renders the scheduler's frames (see ui/observer.rs).
// Live: a full frame, then deltas over server-sent events from /ui/events.
// Offline (the simulator's snapshot): window.TESSERA_SNAPSHOT holds one full frame.
// Plain DOM, no libraries: 1,000 tiles are one innerHTML write.
"use strict";
function tesseraStart() {
  const $ = (id) => document.getElementById(id);
  const st = { ns: [], models: [], tiles: new Map(), order: [], pending: [], problems: [], queues: [], workload: null, series: [], sum: {}, v: 0 };
  window.tessera = { firstMosaicMs: null, frames: 0, state: st };

  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  // A namespace keeps its colour across reloads and restarts: the hue is a hash of its name.
  const hues = new Map();
  function colour(i) {
    const name = st.ns[i] || "";
    if (!hues.has(name)) {
      let h = 2166136261;
      for (let k = 0; k < name.length; k++) h = Math.imul(h ^ name.charCodeAt(k), 16777619);
      hues.set(name, ((h >>> 0) % 360));
    }
    return `hsl(${hues.get(name)},62%,50%)`;
  }

  function cellHtml(t, i, c) {
    const flags = c.x || 0;
    let cls = "gpu";
    if (flags & 1) cls += " bad";
    if (flags & 2) cls += " mig";
    const tip = [`${t.n} GPU #${i}${flags & 1 ? " (unhealthy)" : ""}${flags & 2 ? " (MIG)" : ""}`];
    let segs = "";
    for (const s of c.s || []) {
      const ns = st.ns[s[0]] || "?";
      tip.push(`${ns}/${s[2]} ${(s[1] / 10).toFixed(1)}%${s[3] ? " " + s[3] : ""}`);
      segs += `<i data-ns="${esc(ns)}" style="width:${s[1] / 10}%;background:${colour(s[0])}"></i>`;
    }
    return `<div class="${cls}" data-gpu="${i}" title="${esc(tip.join("\n"))}">${segs}</div>`;
  }

  function tileHtml(t) {
    const cols = t.g.length > 4 ? Math.ceil(t.g.length / 2) : Math.max(t.g.length, 1);
    const model = t.m >= 0 ? st.models[t.m] : "no GPUs";
    const cls = "tile" + (t.r ? "" : " notready");
    return `<div class="${cls}" data-node="${esc(t.n)}" style="--cols:${cols}" title="${esc(t.n)} · ${esc(model)} · frag ${(t.f / 1000).toFixed(2)} GPU${t.r ? "" : " · NotReady"}">` +
      `<div class="nm">${esc(t.n)}</div><div class="gs">${t.g.map((c, i) => cellHtml(t, i, c)).join("")}</div></div>`;
  }

  function renderMosaic() {
    const m = $("mosaic");
    m.classList.toggle("big", st.order.length <= 300);
    m.innerHTML = st.order.map((n) => tileHtml(st.tiles.get(n))).join("");
    if (window.tessera.firstMosaicMs === null && st.order.length) {
      requestAnimationFrame(() => { window.tessera.firstMosaicMs = performance.now(); });
    }
  }

  function replaceTile(t) {
    const old = $("mosaic").querySelector(`.tile[data-node="${CSS.escape(t.n)}"]`);
    if (!old) return false;
    old.outerHTML = tileHtml(t);
    return true;
  }

  function renderSummary() {
    const s = st.sum;
    const pct = s.capacityMilli ? (100 * s.allocatedMilli / s.capacityMilli).toFixed(1) + "%" : "–";
    const items = [["nodes", s.nodes], ["GPUs", s.gpus], ["allocated", pct], ["fragmentation", ((s.fragMilli || 0) / 1000).toFixed(1) + " GPU"],
      ["unhealthy", s.unhealthyGpus], ["pending", s.pending]];
    $("sum").innerHTML = items.map(([k, v]) => `<div><dt>${k}</dt><dd data-k="${k}">${esc(v)}</dd></div>`).join("");
  }

  function renderPending() {
    $("pcount").textContent = `(${st.sum.pending || 0})`;
    $("pending").innerHTML = st.pending.map((p) =>
      `<li data-pod="${esc(p.p)}"><span class="age">${age(p.a)}</span><b>${esc(p.p)}</b><span class="reason">${esc(p.r)}</span></li>`).join("");
  }

  // What the mirror found wrong (a blocked node, a grant it cannot read): shown
  // only while there is something, the first hundred with the total.
  function renderProblems() {
    const n = st.sum.problems || 0;
    $("problembox").hidden = n === 0;
    $("probcount").textContent = n > st.problems.length ? `(${st.problems.length} of ${n})` : `(${n})`;
    $("problems").innerHTML = st.problems.map((p) => `<li>${esc(p)}</li>`).join("");
  }

  // The queue tree, parents first, children indented under them; a bar shows what
  // the queue holds against its fair share (past the mark: above its share).
  function renderQueues() {
    $("queuebox").hidden = !st.queues.length;
    const kids = new Map();
    for (const q of st.queues) {
      const up = q.up || "";
      if (!kids.has(up)) kids.set(up, []);
      kids.get(up).push(q);
    }
    const rows = [];
    const walk = (up, depth) => {
      for (const q of (kids.get(up) || []).sort((a, b) => a.q.localeCompare(b.q))) {
        rows.push([q, depth]);
        if (depth < 16) walk(q.q, depth + 1);
      }
    };
    walk("", 0);
    const gpus = (m) => (m / 1000).toFixed(m < 10000 ? 2 : m < 100000 ? 1 : 0);
    $("queues").tBodies[0].innerHTML = rows.map(([q, depth]) => {
      const scale = Math.max(q.d, q.h, 1);
      const over = q.h > q.d ? " over" : "";
      return `<tr data-queue="${esc(q.q)}"><td style="padding-left:${4 + depth * 12}px">${esc(q.q)}</td>` +
        `<td><span class="qbar${over}" title="held ${gpus(q.h)} of a fair share of ${gpus(q.d)}"><i style="width:${(100 * q.h / scale).toFixed(1)}%"></i><s style="left:${(100 * q.d / scale).toFixed(1)}%"></s></span>` +
        `<span class="held">${gpus(q.h)}</span> / <span class="deserved">${gpus(q.d)}</span></td>` +
        `<td class="guaranteed">${gpus(q.g)}</td><td class="borrowed">${q.b ? gpus(q.b) : ""}</td><td class="waiting">${q.w || ""}</td></tr>`;
    }).join("");
  }

  // The workload the policy scores against: the fragment on the mosaic is measured
  // against these shapes, and models under pressure are kept for constrained pods.
  function renderWorkload() {
    const w = st.workload;
    $("workloadbox").hidden = !w;
    if (!w) return;
    $("wlhead").textContent = w.learned
      ? `learned from ${w.podsLearned} pods on a prior of ${w.priorPods}; ${w.shapes} shapes, rebuilt ${w.generation}×`
      : `built-in workload, ${w.shapes} shapes`;
    $("shapes").innerHTML = w.top.map((s) =>
      `<li><span class="weight">${(100 * s.weight).toFixed(1)}%</span> ${esc(s.text)}</li>`).join("");
    const p = Object.entries(w.pressure || {});
    $("pressure").textContent = p.length
      ? "model pressure: " + p.map(([m, v]) => `${m} ${v.toFixed(2)}`).join(", ")
      : "";
  }

  function age(s) {
    if (s === undefined || s === null) return "";
    if (s < 120) return s + "s";
    if (s < 7200) return Math.round(s / 60) + "m";
    return Math.round(s / 3600) + "h";
  }

  function renderLegend() {
    const used = new Set();
    for (const t of st.tiles.values()) for (const c of t.g) for (const s of c.s || []) used.add(s[0]);
    $("legend").innerHTML = [...used].sort((a, b) => st.ns[a].localeCompare(st.ns[b]))
      .map((i) => `<li><b style="background:${colour(i)}"></b>${esc(st.ns[i])}</li>`).join("");
  }

  function chart(svg, pts, max, label) {
    if (!pts.length) { svg.innerHTML = ""; return; }
    const t0 = pts[0][0], t1 = Math.max(pts[pts.length - 1][0], t0 + 1);
    const xy = pts.map((p) => `${((p[0] - t0) / (t1 - t0) * 300).toFixed(1)},${(68 - p[1] / (max || 1) * 64).toFixed(1)}`).join(" ");
    const last = pts[pts.length - 1][1];
    svg.innerHTML = `<polyline fill="none" stroke="#3366cc" stroke-width="1.5" vector-effect="non-scaling-stroke" points="${xy}"/>` +
      `<text x="4" y="12" font-size="10" fill="#555">${esc(label(last))}</text>`;
  }

  function renderCharts() {
    chart($("util"), st.series.map((p) => [p[0], p[1]]), 1000, (v) => (v / 10).toFixed(1) + "% now");
    const fmax = Math.max(1, ...st.series.map((p) => p[2]));
    chart($("frag"), st.series.map((p) => [p[0], p[2]]), fmax, (v) => (v / 1000).toFixed(1) + " GPU now");
  }

  function apply(frame, full) {
    if (frame.ns) st.ns = frame.ns;
    if (frame.models) st.models = frame.models;
    st.pending = frame.pending || [];
    st.problems = frame.problems || [];
    st.queues = frame.queues || [];
    st.workload = frame.workload || null;
    st.sum = frame.sum || {};
    st.v = frame.v;
    let relayout = full;
    if (full) {
      st.tiles = new Map(frame.nodes.map((t) => [t.n, t]));
      st.order = frame.nodes.map((t) => t.n);
      st.series = frame.series || [];
    } else {
      for (const n of frame.gone || []) { st.tiles.delete(n); relayout = true; }
      for (const t of frame.nodes) {
        if (!st.tiles.has(t.n)) relayout = true;
        st.tiles.set(t.n, t);
      }
      if (relayout) st.order = [...st.tiles.keys()].sort();
      else for (const t of frame.nodes) if (!replaceTile(t)) relayout = true;
      st.series = st.series.concat(frame.series || []).slice(-360);
    }
    if (relayout) renderMosaic();
    renderSummary(); renderPending(); renderProblems(); renderQueues(); renderWorkload(); renderLegend(); renderCharts(); highlight();
    window.tessera.frames++;
  }

  // ---- search -------------------------------------------------------------------------
  let hits = [];
  function localFind(q) {
    const out = [];
    for (const t of st.tiles.values()) {
      if (t.n.toLowerCase().includes(q)) out.push({ node: t.n, gpu: null, what: "node " + t.n });
      t.g.forEach((c, i) => (c.s || []).forEach((s) => {
        const key = st.ns[s[0]] + "/" + s[2];
        if (key.toLowerCase().includes(q)) out.push({ node: t.n, gpu: i, what: `pod ${key} on ${t.n} GPU #${i}` });
      }));
    }
    for (const p of st.pending) if (p.p.toLowerCase().includes(q)) out.push({ node: "", gpu: null, what: `pending pod ${p.p}: ${p.r}` });
    for (const p of st.problems) if (p.toLowerCase().includes(q)) out.push({ node: "", gpu: null, what: `problem: ${p}` });
    return out.slice(0, 50);
  }
  function highlight() {
    const m = $("mosaic");
    m.querySelectorAll(".hit").forEach((e) => e.classList.remove("hit"));
    m.classList.toggle("searching", hits.length > 0);
    for (const h of hits) {
      if (!h.node) continue;
      const tile = m.querySelector(`.tile[data-node="${CSS.escape(h.node)}"]`);
      if (!tile) continue;
      tile.classList.add("hit");
      if (h.gpu !== null && h.gpu !== undefined) {
        const cell = tile.querySelector(`.gpu[data-gpu="${h.gpu}"]`);
        if (cell) cell.classList.add("hit");
      }
    }
  }
  function showHits(q) {
    const box = $("found");
    box.hidden = !q;
    box.querySelector("ul").innerHTML = hits.length ? hits.map((h) => `<li>${esc(h.what)}</li>`).join("") : "<li>nothing matches</li>";
    highlight();
  }
  let timer = null;
  $("q").addEventListener("input", (e) => {
    clearTimeout(timer);
    const q = e.target.value.trim().toLowerCase();
    timer = setTimeout(async () => {
      if (!q) { hits = []; showHits(""); return; }
      if (window.TESSERA_SNAPSHOT) { hits = localFind(q); showHits(q); return; }
      try {
        const r = await fetch("find?q=" + encodeURIComponent(q));
        hits = r.ok ? await r.json() : localFind(q);
      } catch (_) { hits = localFind(q); }
      showHits(q);
    }, 200);
  });

  // ---- detail ---------------------------------------------------------------------------
  $("mosaic").addEventListener("click", (e) => {
    const el = e.target.closest(".tile");
    if (!el) return;
    const t = st.tiles.get(el.dataset.node);
    if (!t) return;
    const rows = t.g.map((c, i) => {
      const who = (c.s || []).map((s) => `${esc(st.ns[s[0]])}/${esc(s[2])} ${(s[1] / 10).toFixed(1)}%${s[3] ? " " + esc(s[3]) : ""}`).join("<br>") || "free";
      const flags = [(c.x & 1) ? "unhealthy" : "", (c.x & 2) ? "MIG" : ""].filter(Boolean).join(", ");
      return `<tr><td>#${i}</td><td>${who}</td><td>${flags}</td></tr>`;
    }).join("");
    const d = $("detail");
    d.hidden = false;
    d.innerHTML = `<b>${esc(t.n)}</b> · ${esc(t.m >= 0 ? st.models[t.m] : "no GPUs")} · fragmentation ${(t.f / 1000).toFixed(2)} GPU${t.r ? "" : " · <b>NotReady</b>"}<table>${rows}</table>`;
  });

  // ---- data -------------------------------------------------------------------------------
  if (window.TESSERA_SNAPSHOT) {
    $("conn").className = "conn offline";
    $("conn").title = "snapshot (offline)";
    document.querySelectorAll(".live-only").forEach((e) => { e.hidden = true; });
    apply(window.TESSERA_SNAPSHOT, true);
    return;
  }
  const es = new EventSource("events");
  es.addEventListener("full", (e) => { $("conn").className = "conn live"; apply(JSON.parse(e.data), true); });
  es.addEventListener("delta", (e) => apply(JSON.parse(e.data), false));
  es.onerror = () => { $("conn").className = "conn"; };
}
// Inline in the offline snapshot, the script runs before the body exists.
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", tesseraStart);
else tesseraStart();
