/* stagetune dashboard: renders the studies page's auto-refresh and the study page's charts
 * (plotly.js, served by the API), trial table and live updates. No dependencies besides
 * Plotly; no network access beyond this server. */
(function () {
  "use strict";

  // ---------------------------------------------------------------- shared helpers

  var COLORS = {
    best: "#1d4ed8",
    picked: "#db2777",
    trialPoint: "rgba(71, 85, 105, 0.55)",
    running: "rgba(14, 165, 233, 0.85)",
    diverged: "rgba(220, 38, 38, 0.6)",
    grid: "#eef2f6",
    axis: "#94a3b8",
    text: "#334155",
  };
  var BASELINE_COLORS = {
    small_batch: "#f59e0b",
    large_batch: "#7c3aed",
    increase_batch: "#059669",
    noise_scale: "#64748b",
  };
  var EXTRA_COLORS = ["#0891b2", "#ea580c", "#65a30d", "#9333ea", "#be123c"];
  var BASELINE_LABELS = {
    small_batch: "small batch",
    large_batch: "large batch (Goyal)",
    increase_batch: "increase batch (Smith)",
    noise_scale: "noise scale (McCandlish)",
    fitted_constant: "budget-fitted constant batch",
    fitted_increase: "budget-fitted increase batch",
    fitted_constant_sqrt: "budget-fitted constant batch, square-root LR",
    fitted_batch_warmup: "budget-fitted batch warm-up",
    recipe_lr_half: "best recipe at half the LR",
    recipe_first_lr_double: "best recipe at twice the first stage's LR",
    recipe_lr_up: "best recipe, LR up: first stage 2x, uncut larger batches 3x",
    runner_up_lr_half: "second-best recipe at half the LR",
    runner_up_first_lr_double: "second-best recipe at twice the first stage's LR",
    runner_up_lr_up: "second-best recipe, LR up: first stage 2x, uncut larger batches 3x",
  };
  var PLOT_CONFIG = {
    displaylogo: false,
    responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toggleSpikelines"],
  };
  var POLL_MS = 2000;
  var TABLE_ROWS = 250; // rows drawn at first; "Show all" draws the rest
  var MAX_LANES = 60; // lanes of the search view (the baselines, the best and the latest)

  function esc(value) {
    return String(value == null ? "" : value)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }
  function isNum(v) {
    return typeof v === "number" && isFinite(v);
  }
  function fmtPct(v, digits) {
    return isNum(v) ? (v * 100).toFixed(digits == null ? 2 : digits) + "%" : "—";
  }
  function fmtInt(v) {
    // thousands separators by hand: toLocaleString is slow over a thousand table rows
    return isNum(v) ? String(Math.round(v)).replace(/\B(?=(\d{3})+(?!\d))/g, ",") : "—";
  }
  function fmtDuration(s) {
    // The rule of tuner/formatting.py: two significant digits below 10 s.
    if (!isNum(s) || s < 0) return "—";
    if (s === 0) return "0s";
    if (s < 9.95) return s.toFixed(Math.max(0, 1 - Math.floor(Math.log10(s)))) + "s";
    var t = Math.round(s);
    var d = Math.floor(t / 86400), h = Math.floor((t % 86400) / 3600);
    var m = Math.floor((t % 3600) / 60), sec = t % 60;
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (d) return d + "d " + two(h) + "h";
    if (h) return h + "h " + two(m) + "m";
    if (m) return m + "m " + two(sec) + "s";
    return sec + "s";
  }
  // Ticks of a log axis that read as numbers: 1, 2, 5 x 10^k over [lo, hi] (one more on
  // each side), thinned to powers of ten when there would be more than 8.
  function logTicks(lo, hi) {
    if (!(lo > 0 && hi > 0)) return [];
    var out = [];
    for (var k = Math.floor(Math.log10(lo)) - 1; k <= Math.ceil(Math.log10(hi)); k++) {
      [1, 2, 5].forEach(function (m) { out.push(m * Math.pow(10, k)); });
    }
    var inside = out.filter(function (v) { return v >= lo / 2.5 && v <= hi * 2.5; });
    if (inside.length > 8) {
      inside = inside.filter(function (v) { var e = Math.log10(v); return Math.abs(e - Math.round(e)) < 1e-9; });
    }
    return inside.map(function (v) { return Number(v.toPrecision(6)); });
  }
  function fmtBatch(v) {
    if (!isNum(v)) return "—";
    return Math.abs(v - Math.round(v)) < 0.05 || v >= 1000 ? fmtInt(v) : v.toFixed(1);
  }
  function fmtObjective(v, name) {
    if (!isNum(v)) return "—";
    if (name.indexOf("accuracy") >= 0) return fmtPct(v);
    if (name.indexOf("psnr") >= 0) return v.toFixed(2) + " dB";
    if (name.indexOf("wall_time") >= 0) return fmtDuration(v);
    if (name.indexOf("steps") >= 0) return fmtInt(v) + " steps";
    return v.toPrecision(4);
  }
  function fmtTime(iso, sameDayAs) {
    if (!iso) return "—";
    var d = new Date(iso);
    var time = d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
    if (sameDayAs && new Date(sameDayAs).toDateString() === d.toDateString()) return time;
    return d.toLocaleDateString(undefined, { month: "short", day: "numeric" }) + " " + time;
  }
  function fmtSummary(summary) {
    // "64@0-3 -> 256@3-8": lines may break between stages, never inside one
    return String(summary || "").split(" -> ").map(function (stage) {
      return '<span class="stage">' + esc(stage) + "</span>";
    }).join(" -&gt; ");
  }
  function capitalize(text) {
    return text ? text.charAt(0).toUpperCase() + text.slice(1) : text;
  }
  function baselineLabel(name) {
    return BASELINE_LABELS[name] || name;
  }
  function baselineColor(name, names) {
    if (BASELINE_COLORS[name]) return BASELINE_COLORS[name];
    var others = names.filter(function (n) { return !BASELINE_COLORS[n]; }).sort();
    return EXTRA_COLORS[Math.max(0, others.indexOf(name)) % EXTRA_COLORS.length];
  }
  function el(id) {
    return document.getElementById(id);
  }
  function baseLayout(extra) {
    var layout = {
      margin: { l: 58, r: 14, t: 34, b: 44 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "#ffffff",
      font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12, color: COLORS.text },
      hovermode: "closest",
      hoverlabel: { bgcolor: "#0f172a", bordercolor: "#0f172a", font: { color: "#fff", size: 12 } },
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1.01, yanchor: "bottom", bgcolor: "rgba(0,0,0,0)", font: { size: 11.5 } },
      uirevision: "keep",
    };
    Object.keys(extra || {}).forEach(function (k) { layout[k] = extra[k]; });
    return layout;
  }
  function axis(extra) {
    var a = { gridcolor: COLORS.grid, zerolinecolor: COLORS.grid, linecolor: "#cbd5e1", tickcolor: "#cbd5e1", automargin: true };
    Object.keys(extra || {}).forEach(function (k) { a[k] = extra[k]; });
    return a;
  }
  function emptyChart(node, message) {
    if (window.Plotly && node.data) window.Plotly.purge(node);
    node.innerHTML = '<div class="chart-empty">' + esc(message) + "</div>";
    node.dataset.empty = "true";
  }
  function draw(node, traces, layout) {
    if (node.dataset.empty === "true") {
      node.innerHTML = "";
      delete node.dataset.empty;
    }
    return window.Plotly.react(node, traces, layout, PLOT_CONFIG);
  }

  // ---------------------------------------------------------------- studies page

  function initStudies() {
    function schedule() {
      var root = el("studies-root");
      if (root && root.dataset.live === "true") window.setTimeout(refresh, 3000);
    }
    function refresh() {
      fetch(window.location.href, { cache: "no-store", headers: { Accept: "text/html" } })
        .then(function (res) { return res.ok ? res.text() : Promise.reject(res.status); })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("studies-root");
          var root = el("studies-root");
          if (fresh && root) root.replaceWith(fresh);
        })
        .catch(function () { /* keep the last view; try again */ })
        .then(schedule);
    }
    schedule();
  }

  // ---------------------------------------------------------------- study page: state

  var S = null; // the study page state

  function loadState(data) {
    S = {
      study: null,
      counts: {},
      trialTotal: 0,
      trials: new Map(),
      curves: new Map(),
      lanes: new Map(),
      schedules: {},
      comparison: [],
      links: data.links,
      live: false,
      etag: null,
      serverTime: null,
      clockOffset: 0,
      picked: null,
      pictures: new Map(),
      cost: "steps",
      zoom: "all",
      sort: { key: "number", dir: 1 },
      filter: "",
      showAllRows: false,
      importance: { at: 0, trialsDone: -1, pending: false },
      wasLive: false,
    };
    merge(data);
    S.wasLive = S.live;
  }

  function merge(data, serverTime) {
    if (!data.incremental) {
      S.trials = new Map();
      S.curves = new Map();
      S.lanes = new Map();
    }
    data.trials.forEach(function (t) { S.trials.set(t.number, t); });
    Object.keys(data.curves).forEach(function (k) { S.curves.set(Number(k), data.curves[k]); });
    Object.keys(data.lanes || {}).forEach(function (k) { S.lanes.set(Number(k), data.lanes[k]); });
    S.study = data.study;
    S.counts = data.counts;
    S.trialTotal = data.trial_total;
    S.schedules = data.schedules;
    S.noise = data.noise_scale || null;
    S.comparison = data.comparison;
    S.live = data.live;
    serverTime = serverTime || data.server_time;
    if (serverTime) {
      S.serverTime = serverTime;
      S.clockOffset = Date.parse(serverTime) - Date.now();
    }
  }

  function trialList() {
    return Array.from(S.trials.values()).sort(function (a, b) { return a.number - b.number; });
  }
  function baselineNames() {
    return trialList().filter(function (t) { return t.baseline; }).map(function (t) { return t.baseline; });
  }
  function bestNumber() {
    return S.study.best_trial_number;
  }
  function objectiveName() {
    return S.study.objective.names[0];
  }
  // The study's metric (objective.metric): its name, direction, words and format.
  function metric() {
    var o = (S.study && S.study.objective) || {};
    return {
      name: o.metric || "val_accuracy", dir: o.metric_direction || "max",
      label: o.metric_label || "validation accuracy", format: o.metric_format || "percent",
    };
  }
  function fmtMetric(v, digits) {
    if (!isNum(v)) return "—";
    var f = metric().format;
    if (f === "percent") return fmtPct(v, digits);
    if (f === "db") return v.toFixed(digits == null ? 2 : digits) + " dB";
    return v.toPrecision(4);
  }
  // Plotly's number format of the metric (hover texts, axis ticks).
  function metricD3(axisTicks) {
    var f = metric().format;
    if (f === "percent") return axisTicks ? (S.zoom === "top" ? ".1%" : ".0%") : ".2%";
    if (f === "db") return ".2f";
    return axisTicks ? "" : ".4g";
  }
  // A comparison stored before studies had metrics has only the accuracy difference.
  function withMetricDelta(v) {
    if (v.metric_delta != null || v.accuracy_delta == null) return v;
    var copy = {};
    Object.keys(v).forEach(function (k) { copy[k] = v[k]; });
    copy.metric_delta = v.accuracy_delta;
    return copy;
  }
  function metricBetter(a, b) { return metric().dir === "min" ? a < b : a > b; }
  function capital(text) { return text.charAt(0).toUpperCase() + text.slice(1); }

  // ---------------------------------------------------------------- header, banner, KPIs

  function renderHeader() {
    var st = S.study;
    var badge = el("study-status");
    badge.className = "badge badge-lg badge-" + st.status;
    badge.textContent = st.status;
    var live = el("live-indicator");
    live.className = "live-indicator" + (S.live ? " is-live" : "");
    live.innerHTML = S.live ? '<span class="pulse"></span> Live' : "";
    document.title = st.name + " · " + st.status + " · stagetune";
    var dl = el("download-best");
    var hasBest = st.best_trial_number != null;
    dl.classList.toggle("is-disabled", !hasBest);
    if (hasBest) {
      dl.removeAttribute("aria-disabled");
      dl.removeAttribute("title");
    }
    renderBanner();
  }

  function renderBanner() {
    var st = S.study;
    var banner = el("study-banner");
    var best = st.best_trial_number != null ? S.trials.get(st.best_trial_number) : null;
    var bestText = best
      ? " The best schedule is trial #" + best.number + (best.baseline ? " (" + baselineLabel(best.baseline) + " baseline)" : "") +
        ": <code>" + fmtSummary(best.summary) + "</code>, " + esc(fmtObjective(st.best_value, objectiveName())) + "."
      : "";
    var html = null, kind = st.status;
    var search = st.search ? '<span class="banner-detail" id="study-search">' + esc(capitalize(st.search)) + ".</span>" : "";
    if (st.status === "completed") {
      html = "<strong>Study completed" + (S.wasLive ? " just now" : "") + ".</strong>" +
        '<span class="banner-detail">' + bestText + (st.note && (st.best_is_baseline || !best) ? " " + esc(capitalize(st.note)) + "." : "") +
        (st.lead_note && best && !st.best_is_baseline ? ' <span id="study-lead">' + esc(st.lead_note) + ".</span>" : "") +
        (st.split_note && best && !st.best_is_baseline ? ' <span id="study-split">' + esc(st.split_note) + ".</span>" : "") + "</span>" + search;
    } else if (st.status === "failed") {
      html = "<strong>Study failed" + (S.wasLive ? " just now" : "") + ".</strong>" +
        '<span class="banner-detail">' + esc(st.error || "no error message recorded") + "</span>";
    } else if (st.status === "cancelled") {
      html = "<strong>Study cancelled.</strong>" +
        '<span class="banner-detail">' + (st.error ? esc(st.error) : "") + bestText + "</span>" + search;
    } else if (st.status === "queued" && st.error) {
      // a worker claimed it but could not start it (Ray unreachable) and gave it back
      html = "<strong>Queued again.</strong><span class=\"banner-detail\" id=\"study-queued-reason\">" +
        esc(capitalize(st.error)) + ". A worker tries again by itself; this page updates by itself.</span>";
    } else if (st.status === "queued") {
      html = "<strong>Queued.</strong><span class=\"banner-detail\">Waiting for a worker to pick it up; this page updates by itself.</span>";
    } else if (st.cancel_requested) {
      kind = "cancelled";
      html = "<strong>Cancelling…</strong><span class=\"banner-detail\">The worker stops the study at its next check.</span>";
    }
    if (html === null) {
      banner.hidden = true;
      return;
    }
    banner.className = "banner banner-" + kind;
    banner.dataset.status = st.status;
    banner.innerHTML = html;
    banner.hidden = false;
  }

  function elapsedNow() {
    var st = S.study;
    if (!st.started_at) return null;
    var end = st.finished_at ? Date.parse(st.finished_at) : Date.now() + S.clockOffset;
    return Math.max(0, (end - Date.parse(st.started_at)) / 1000);
  }

  function ratioText(r, noun) {
    if (!isNum(r) || r <= 0) return null;
    if (Math.abs(r - 1) < 0.005) return "same " + noun;
    return r < 1
      ? '<span class="good">' + (1 / r).toFixed(1) + "× fewer</span> " + noun
      : '<span class="bad">' + r.toFixed(1) + "× more</span> " + noun;
  }
  // The best schedule's cost against a baseline's as a KPI value: "8.3× more steps" when
  // the best needed more (ratio > 1), "4.0× fewer steps" when it needed fewer.
  function ratioValue(r, noun) {
    if (!isNum(r) || r <= 0) return "—";
    if (Math.abs(r - 1) < 0.005) return 'same<span class="unit"> ' + noun + "</span>";
    return r < 1
      ? '<span class="good">' + (1 / r).toFixed(1) + '</span><span class="unit">× fewer ' + noun + "</span>"
      : '<span class="bad">' + r.toFixed(1) + '</span><span class="unit">× more ' + noun + "</span>";
  }
  function sizeText(r) {
    if (!isNum(r) || r <= 0) return null;
    if (Math.abs(r - 1) < 0.005) return "same";
    return r > 1 ? r.toFixed(1) + "× larger" : (1 / r).toFixed(1) + "× smaller";
  }
  function deltaText(d) {
    // a difference of the study's metric, best - other: points for an accuracy, else its units
    if (!isNum(d)) return null;
    var m = metric();
    if (m.format === "percent") {
      var pp = d * 100;
      var good = m.dir === "min" ? pp <= 0.005 : pp >= -0.005;
      return '<span class="' + (good ? "good" : "bad") + '">' + (pp >= 0 ? "+" : "−") + Math.abs(pp).toFixed(2) + " pp</span>";
    }
    var ok = m.dir === "min" ? d <= 0 : d >= 0;
    var size = Math.abs(d);
    var text = m.format === "db" ? size.toFixed(2) + " dB" : size.toPrecision(3);
    return '<span class="' + (ok ? "good" : "bad") + '">' + (d >= 0 ? "+" : "−") + text + "</span>";
  }

  function renderKpis() {
    var st = S.study;
    var name = objectiveName();
    var best = st.best_trial_number != null ? S.trials.get(st.best_trial_number) : null;
    var cards = [];
    var bestLabel = name === metric().name ? "Best " + metric().label : "Best objective";
    var bestRow = S.comparison.filter(function (r) { return r.role === "best"; })[0];
    var seeded = bestRow && bestRow.seeds_text ? bestRow : null;
    if (seeded) bestLabel += " (mean of " + seeded.seed_count + " fresh seeds)";
    cards.push(
      kpi(bestLabel, isNum(st.best_value) ? esc(fmtObjective(st.best_value, name)) : "—",
        best ? (seeded ? esc(seeded.seeds_text) + " · " : "") + "trial #" + best.number +
          (best.baseline ? " (" + esc(baselineLabel(best.baseline)) + " baseline)" : "") +
          " · <code>" + fmtSummary(best.summary) + "</code>" :
          "no completed trial yet", "kpi-best")
    );
    var rows = S.comparison.filter(function (r) { return r.role === "baseline" && r.vs_best; });
    var ref = rows.filter(function (r) { return r.baseline === "small_batch"; })[0] || rows[0];
    if (ref && !ref.is_best) {
      var v = withMetricDelta(ref.vs_best);
      var steps = ratioText(v.steps_ratio, "steps");
      cards.push(kpi("vs " + esc(baselineLabel(ref.baseline)),
        ratioValue(v.steps_ratio, "steps"),
        [deltaText(v.metric_delta) ? deltaText(v.metric_delta) + " " + esc(metric().label.replace("validation ", "")) : null,
          ratioText(v.wall_time_ratio, "wall time")].filter(Boolean).join(" · ") || (steps || ""),
        "kpi-baseline"));
    } else {
      cards.push(kpi("vs baselines", "—", ref && ref.is_best ? "a baseline is the best schedule" :
        "shown once the best trial and a baseline have finished", "kpi-baseline"));
    }
    var c = S.counts;
    var parts = ["completed", "stopped", "diverged", "failed", "running"]
      .filter(function (k) { return c[k]; })
      .map(function (k) { return c[k] + " " + k; });
    var budget = Math.max(1, st.budget);
    cards.push(kpi("Trials",
      fmtInt(st.trials_done) + '<span class="unit">/ ' + fmtInt(st.budget) + "</span>",
      parts.join(" · ") || "none yet", "kpi-trials",
      '<div class="progress"><div class="progress-done" style="width:' + Math.min(100, 100 * st.trials_done / budget) +
      '%"></div><div class="progress-running" style="width:' + Math.min(100, 100 * st.trials_running / budget) + '%"></div></div>'));
    cards.push(kpi("Elapsed", '<span id="elapsed-value">' + esc(fmtDuration(elapsedNow())) + "</span>",
      st.started_at ? esc(fmtTime(st.started_at)) + (st.finished_at ? " → " + esc(fmtTime(st.finished_at, st.started_at)) : " → now") +
        (st.worker_id ? " · worker <code class=\"stage\">" + esc(st.worker_id) + "</code>" : "") : "not started yet", "kpi-elapsed"));
    el("kpis").innerHTML = cards.join("");
  }
  function kpi(label, value, sub, id, extra) {
    return '<div class="kpi" id="' + id + '"><div class="kpi-label">' + label + '</div><div class="kpi-value">' + value +
      '</div><div class="kpi-sub">' + sub + "</div>" + (extra || "") + "</div>";
  }

  // ---------------------------------------------------------------- learning curves

  function curveOf(number) {
    var c = S.curves.get(number);
    return c && c.epoch.length ? c : null;
  }

  function renderCurves() {
    var node = el("chart-curves");
    var best = bestNumber();
    var names = baselineNames();
    var groups = { trial: [], running: [], diverged: [] };
    var stoppedEnds = { x: [], y: [], n: [] };
    var special = [];
    trialList().forEach(function (t) {
      var c = curveOf(t.number);
      if (!c) return;
      if (t.baseline || t.number === best || t.number === S.picked) {
        special.push(t);
        return;
      }
      var group = t.status === "diverged" || t.status === "failed" ? "diverged" : t.status === "running" ? "running" : "trial";
      groups[group].push(t);
      if (t.status === "stopped") {
        for (var i = c.value.length - 1; i >= 0; i--) {
          if (isNum(c.value[i])) {
            stoppedEnds.x.push(c.epoch[i]);
            stoppedEnds.y.push(c.value[i]);
            stoppedEnds.n.push(t.number);
            break;
          }
        }
      }
    });
    var traces = [];
    function merged(list, name, line, legendrank) {
      var x = [], y = [], n = [];
      list.forEach(function (t) {
        var c = curveOf(t.number);
        for (var i = 0; i < c.epoch.length; i++) {
          x.push(c.epoch[i]);
          y.push(c.value[i]);
          n.push(t.number);
        }
        x.push(null);
        y.push(null);
        n.push(null);
      });
      return {
        type: "scatter", mode: "lines", name: name + " (" + list.length + ")", x: x, y: y, customdata: n,
        line: line, connectgaps: false, legendrank: legendrank, meta: "group",
        hovertemplate: "trial #%{customdata}<br>epoch %{x}: %{y:" + metricD3() + "}<extra></extra>",
      };
    }
    if (groups.trial.length) {
      // fainter as they get many, so a thousand curves stay a readable band
      var alpha = Math.max(0.06, Math.min(0.3, 0.3 * Math.sqrt(40 / groups.trial.length)));
      traces.push(merged(groups.trial, "tuned trials", { color: "rgba(100, 116, 139, " + alpha.toFixed(3) + ")", width: 1.2 }, 900));
    }
    if (groups.running.length) traces.push(merged(groups.running, "running", { color: COLORS.running, width: 1.6, dash: "dot" }, 800));
    if (groups.diverged.length) traces.push(merged(groups.diverged, "diverged / failed", { color: COLORS.diverged, width: 1.2, dash: "dot" }, 850));
    if (stoppedEnds.x.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "stopped early", x: stoppedEnds.x, y: stoppedEnds.y, customdata: stoppedEnds.n,
        marker: { symbol: "x-thin", size: 7, line: { width: 1.5, color: COLORS.trialPoint } }, legendrank: 950,
        hovertemplate: "trial #%{customdata} stopped after epoch %{x}: %{y:" + metricD3() + "}<extra></extra>",
      });
    }
    special.sort(function (a, b) { return rank(a) - rank(b); });
    special.forEach(function (t) {
      var c = curveOf(t.number);
      var isBest = t.number === best;
      var color = isBest ? COLORS.best : t.baseline ? baselineColor(t.baseline, names) : COLORS.picked;
      var label = (isBest ? "best #" + t.number : t.baseline ? baselineLabel(t.baseline) : "trial #" + t.number) +
        (isBest && t.baseline ? " (" + baselineLabel(t.baseline) + ")" : "");
      traces.push({
        type: "scatter", mode: "lines+markers", name: label, x: c.epoch, y: c.value,
        line: { color: color, width: isBest ? 3.5 : 2.4 }, marker: { size: isBest ? 5 : 4, color: color },
        legendrank: isBest ? 1 : t.baseline ? 10 : 5, customdata: c.epoch.map(function () { return t.number; }),
        hovertemplate: esc(label) + "<br>epoch %{x}: %{y:" + metricD3() + "}<extra></extra>",
      });
    });
    if (!traces.length) {
      emptyChart(node, "No epoch has been reported yet.");
      return;
    }
    var yaxis = axis({ title: { text: metric().label }, tickformat: metricD3(true) });
    if (S.zoom === "top") {
      var range = topRange();
      if (range) {
        yaxis.range = range;
        yaxis.autorange = false;
      }
    }
    draw(node, traces, baseLayout({
      uirevision: S.zoom,
      xaxis: axis({ title: { text: "epoch" }, rangemode: "tozero" }),
      yaxis: yaxis,
    }));
  }
  function topRange() {
    // the band where the completed trials end: from their worst 10th percentile to the best
    var finals = trialList()
      .filter(function (t) { return t.status === "completed" && isNum(t.metric_value); })
      .map(function (t) { return t.metric_value; })
      .sort(function (a, b) { return a - b; });
    if (!finals.length) return null;
    var lo, hi;
    if (metric().dir === "min") {
      lo = finals[0];
      hi = finals[Math.ceil(0.9 * (finals.length - 1))];
    } else {
      lo = finals[Math.floor(0.1 * (finals.length - 1))];
      hi = finals[finals.length - 1];
    }
    var floor = metric().format === "percent" ? 0.004 : 1e-3 * Math.max(1, Math.abs(hi));
    var pad = Math.max(floor, (hi - lo) * 0.15);
    return [lo - pad, hi + pad];
  }

  function rank(t) {
    // draw order: picked, baselines, best on top
    if (t.number === bestNumber()) return 3;
    if (t.baseline) return 2;
    return 1;
  }

  // ---------------------------------------------------------------- metric vs cost

  function paretoFront(points) {
    // the metric at its best (max or min), minimise x (cost): sweep by cost, keep strict records
    var sorted = points.slice().sort(function (a, b) {
      return a.x - b.x || (metricBetter(a.y, b.y) ? -1 : metricBetter(b.y, a.y) ? 1 : 0);
    });
    var front = [];
    var top = null;
    sorted.forEach(function (p) {
      if (top === null || metricBetter(p.y, top)) {
        front.push(p);
        top = p.y;
      }
    });
    return front;
  }

  function renderCost() {
    var node = el("chart-cost");
    var key = S.cost;
    var best = bestNumber();
    var names = baselineNames();
    var costLabel = key === "steps" ? "optimizer steps" : "wall time (s)";
    var completed = [], stopped = [], bases = [], bestPt = null, pickedPt = null;
    trialList().forEach(function (t) {
      if (!isNum(t.metric_value) || !isNum(t[key]) || t[key] <= 0) return;
      if (t.status !== "completed" && t.status !== "stopped") return;
      var p = { x: t[key], y: t.metric_value, t: t };
      if (t.number === best) bestPt = p;
      if (t.number === S.picked) pickedPt = p;
      if (t.baseline) bases.push(p);
      else if (t.status === "completed") completed.push(p);
      else stopped.push(p);
    });
    var pool = completed.concat(bases.filter(function (p) { return p.t.status === "completed"; }));
    if (bestPt && pool.indexOf(bestPt) < 0 && bestPt.t.status === "completed") pool.push(bestPt);
    var front = paretoFront(pool);
    function hover(p) {
      return "trial #" + p.t.number + (p.t.baseline ? " · " + esc(baselineLabel(p.t.baseline)) : "") +
        "<br>" + esc(p.t.summary || "") + "<br>" + esc(metric().label.replace("validation ", "")) + " " + fmtMetric(p.y) + "<br>" +
        (key === "steps" ? fmtInt(p.x) + " steps" : fmtDuration(p.x) + " wall time");
    }
    function markers(list, name, marker, extra) {
      var tr = {
        type: "scatter", mode: "markers", name: name, x: list.map(function (p) { return p.x; }),
        y: list.map(function (p) { return p.y; }), customdata: list.map(function (p) { return p.t.number; }),
        text: list.map(hover), hovertemplate: "%{text}<extra></extra>", marker: marker,
      };
      Object.keys(extra || {}).forEach(function (k) { tr[k] = extra[k]; });
      return tr;
    }
    var traces = [];
    var plain = completed.filter(function (p) { return p !== bestPt; });
    if (plain.length) traces.push(markers(plain, "completed (" + plain.length + ")", { size: 8, color: "rgba(71, 85, 105, 0.55)", line: { width: 1, color: "#fff" } }, { legendrank: 900 }));
    if (stopped.length) traces.push(markers(stopped, "stopped early (" + stopped.length + ")", { size: 7, symbol: "circle-open", color: "rgba(100, 116, 139, 0.65)" }, { legendrank: 950, visible: "legendonly" }));
    if (front.length) {
      traces.push({
        type: "scatter", mode: "lines", name: "Pareto front", x: front.map(function (p) { return p.x; }),
        y: front.map(function (p) { return p.y; }), line: { shape: "hv", color: COLORS.best, width: 2, dash: "dash" },
        hoverinfo: "skip", legendrank: 20, meta: "pareto",
      });
    }
    bases.forEach(function (p) {
      if (p === bestPt) return;
      var color = baselineColor(p.t.baseline, names);
      traces.push(markers([p], baselineLabel(p.t.baseline), { size: 13, symbol: "diamond", color: color, line: { width: 1.5, color: "#fff" } }, { legendrank: 10 }));
    });
    if (bestPt) traces.push(markers([bestPt], "best #" + bestPt.t.number, { size: 19, symbol: "star", color: COLORS.best, line: { width: 1.5, color: "#fff" } }, { legendrank: 1 }));
    if (pickedPt && pickedPt !== bestPt) traces.push(markers([pickedPt], "trial #" + pickedPt.t.number, { size: 17, symbol: "circle-open", color: COLORS.picked, line: { width: 3 } }, { legendrank: 5 }));
    if (!traces.length) {
      emptyChart(node, "No trial with a " + esc(metric().label) + " and a " + (key === "steps" ? "step count" : "wall time") + " yet.");
      return;
    }
    var xs = [];
    traces.forEach(function (tr) { (tr.x || []).forEach(function (x) { if (isNum(x) && x > 0) xs.push(x); }); });
    var ticks = logTicks(Math.min.apply(null, xs), Math.max.apply(null, xs));
    draw(node, traces, baseLayout({
      uirevision: S.cost,
      xaxis: axis({
        title: { text: costLabel + " (log)" }, type: "log", tickvals: ticks,
        ticktext: ticks.map(function (v) { return key === "steps" ? fmtInt(v) : fmtDuration(v); }),
      }),
      yaxis: axis({ title: { text: "final " + metric().label }, tickformat: metric().format === "percent" ? ".1%" : "" }),
    }));
  }

  // ---------------------------------------------------------------- schedule picture

  function pictureOf(number) {
    return S.schedules[String(number)] || S.pictures.get(number) || null;
  }

  function loadPicture(number) {
    if (pictureOf(number)) return Promise.resolve(pictureOf(number));
    var url = S.links.schedule.replace("{number}", String(number));
    return fetch(url, { headers: { Accept: "application/json" } })
      .then(function (res) { return res.ok ? res.json() : Promise.reject(res.status); })
      .then(function (pic) {
        S.pictures.set(number, pic);
        return pic;
      });
  }

  function renderSchedule() {
    var node = el("chart-schedule");
    var best = bestNumber();
    var names = baselineNames();
    var shown = [];
    trialList().forEach(function (t) {
      if (t.baseline && t.number !== best && pictureOf(t.number)) shown.push({ t: t, color: baselineColor(t.baseline, names), label: baselineLabel(t.baseline), width: 2.2 });
    });
    if (best != null && pictureOf(best)) {
      var bt = S.trials.get(best);
      shown.push({ t: bt || { number: best }, color: COLORS.best, label: "best #" + best, width: 3.4 });
    }
    if (S.picked != null && S.picked !== best && pictureOf(S.picked)) {
      var pt = S.trials.get(S.picked);
      if (!(pt && pt.baseline)) shown.push({ t: pt || { number: S.picked }, color: COLORS.picked, label: "trial #" + S.picked, width: 2.6, dash: "dot" });
    }
    if (!shown.length) {
      emptyChart(node, "The best schedule and the baselines appear here once trials have run; pick any trial above.");
      return;
    }
    var traces = [];
    var batches = [];
    shown.forEach(function (s) {
      var pic = pictureOf(s.t.number);
      batches = batches.concat(pic.batch_sizes);
      traces.push({
        type: "scatter", mode: "lines", name: s.label, legendgroup: s.label, x: pic.batch_epochs, y: pic.batch_sizes,
        line: { shape: "hv", color: s.color, width: s.width, dash: s.dash || "solid" }, xaxis: "x", yaxis: "y",
        hovertemplate: esc(s.label) + "<br>epoch %{x}: batch %{y}<extra></extra>", meta: "batch",
      });
      traces.push({
        type: "scatter", mode: "lines", name: s.label + " LR", legendgroup: s.label, showlegend: false, x: pic.lr_epochs,
        y: pic.lrs.map(function (v) { return v > 0 ? v : null; }), // log axis: an LR decayed to 0 ends the line
        line: { color: s.color, width: Math.max(1.6, s.width - 0.8), dash: s.dash || "solid" }, xaxis: "x", yaxis: "y2",
        hovertemplate: esc(s.label) + "<br>epoch %{x:.2f}: LR %{y:.4g}<extra></extra>", meta: "lr",
      });
    });
    var lo = Math.min.apply(null, batches), hi = Math.max.apply(null, batches);
    if (S.noise && S.noise.value.length) {
      // The measured gradient noise scale (McCandlish et al.): the critical batch it
      // estimates, which the noise-scale candidate follows.
      var shownNoise = S.noise.value.map(function (v) { return Math.min(Math.max(v, lo / 8), hi * 8); });
      lo = Math.min(lo, Math.min.apply(null, shownNoise));
      hi = Math.max(hi, Math.max.apply(null, shownNoise));
      traces.push({
        type: "scatter", mode: "lines+markers", name: "noise scale (small batch #" + S.noise.trial + ")",
        x: S.noise.epoch, y: shownNoise, customdata: S.noise.value,
        line: { color: "#64748b", width: 1.6, dash: "dot" }, marker: { size: 4, color: "#64748b" },
        xaxis: "x", yaxis: "y", meta: "noise",
        hovertemplate: "gradient noise scale<br>epoch %{x:.1f}: %{customdata:.4g}<extra></extra>",
      });
    }
    var ticks = [];
    for (var p = Math.floor(Math.log2(lo)); p <= Math.ceil(Math.log2(hi)); p++) ticks.push(Math.pow(2, p));
    if (ticks.length > 9) ticks = ticks.filter(function (_, i) { return i % 2 === 0; });
    draw(node, traces, baseLayout({
      margin: { l: 62, r: 14, t: 34, b: 44 },
      xaxis: axis({ title: { text: "epoch" }, anchor: "y2", rangemode: "tozero" }),
      yaxis: axis({
        title: { text: "batch size (log₂)" }, type: "log", domain: [0.5, 1], tickvals: ticks,
        ticktext: ticks.map(function (v) { return fmtInt(v); }),
        range: [Math.log10(lo) - 0.18, Math.log10(hi) + 0.18],
      }),
      yaxis2: axis({ title: { text: "learning rate (log)" }, domain: [0, 0.42], type: "log", dtick: 1 }),
    }));
  }

  function renderNoiseFloor() {
    // What the small batch's measured noise scale says about how few steps can match it
    // (tuner.noise_candidate.noise_scale_step_floor).
    var node = el("noise-floor");
    var f = S.noise && S.noise.step_floor;
    if (!f) {
      node.textContent = "";
      node.classList.remove("warn");
      return;
    }
    node.textContent = f.text;  // tuner.noise_candidate.step_floor_text
    node.classList.toggle("warn", !!f.cap_below_floor);
  }

  // ---------------------------------------------------------------- picking a trial

  function renderPicker() {
    var select = el("trial-picker");
    var best = bestNumber();
    var options = ['<option value="">best and baselines</option>'];
    trialList().forEach(function (t) {
      var tag = t.number === best ? "★ best · " : t.baseline ? baselineLabel(t.baseline) + " · " : "";
      var acc = isNum(t.metric_value) ? " · " + fmtMetric(t.metric_value, 1) : "";
      options.push('<option value="' + t.number + '"' + (t.number === S.picked ? " selected" : "") + ">#" + t.number + " · " +
        esc(tag + t.status + acc + " · " + (t.summary || "")) + "</option>");
    });
    var html = options.join("");
    if (select.dataset.html !== html) {
      select.innerHTML = html;
      select.dataset.html = html;
    }
    select.value = S.picked == null ? "" : String(S.picked);
    renderPickedActions();
  }

  function trialYaml(number) {
    return S.links.trial_yaml.replace("{number}", String(number));
  }

  function renderPickedActions() {
    var box = el("picked-actions");
    if (S.picked == null) {
      box.innerHTML = '<span class="muted">Click a table row, a point or a curve to compare a trial.</span>';
      return;
    }
    var t = S.trials.get(S.picked);
    if (!t) {
      box.innerHTML = "";
      return;
    }
    var canDownload = t.status !== "running";
    box.innerHTML = '<span class="muted">trial #' + t.number + " · <code>" + fmtSummary(t.summary) + "</code></span>" +
      (canDownload
        ? '<a class="button button-small" id="download-picked" href="' + esc(trialYaml(t.number)) + '" download>Download YAML</a>'
        : '<span class="muted">(running: YAML once it finishes)</span>');
  }

  function pick(number) {
    S.picked = number;
    renderPicker();
    renderTableSelection();
    renderCurves();
    renderCost();
    renderLanes();
    if (number == null) {
      renderSchedule();
      return;
    }
    loadPicture(number).then(function () {
      if (S.picked === number) renderSchedule();
    }, function () {
      renderSchedule();
    });
  }

  // ---------------------------------------------------------------- best vs baselines

  function renderComparison() {
    var box = el("comparison");
    var names = baselineNames();
    if (!S.comparison.length) {
      box.innerHTML = '<div class="chart-empty" style="height:90px">Shown once a trial has completed.</div>';
      el("comparison-note").textContent = "";
      return;
    }
    var rows = S.comparison.map(function (r) {
      var isBestRow = r.role === "best";
      var color = isBestRow ? COLORS.best : baselineColor(r.baseline || r.candidate, names);
      var label = isBestRow ? "Best · #" + r.number + (r.baseline ? " (" + baselineLabel(r.baseline) + ")" : "") +
          (r.candidate ? " (" + baselineLabel(r.candidate) + " candidate)" : "") :
        r.candidate ? baselineLabel(r.candidate) + " candidate · #" + r.number :
        baselineLabel(r.baseline) + " · #" + r.number;
      var v = withMetricDelta(r.vs_best || {});
      function cell(text, delta) {
        return "<td>" + text + (delta && !isBestRow ? '<span class="delta">' + delta + "</span>" : "") + "</td>";
      }
      return '<tr class="' + (isBestRow ? "row-best" : "") + '" data-role="' + r.role + '" data-number="' + esc(r.number) + '">' +
        '<td><span class="swatch" style="background:' + color + '"></span>' + esc(label) +
        '<div class="muted small"><code>' + fmtSummary(r.summary) + "</code></div>" +
        (r.outside ? '<div class="muted small outside">' + esc(r.outside) + ": never the result</div>" : "") +
        // a row that did not train its whole schedule: its figures are of what it trained
        (r.ended ? '<div class="muted small ended">' + esc(r.ended) + "</div>" : "") +
        "</td>" +
        cell(fmtMetric(r.metric_value) + (r.seeds_text ? '<div class="muted small seeds">' +
          r.seed_count + ' fresh seeds: <span class="nowrap">' + esc(r.seeds_text) + "</span></div>" : ""),
          v.metric_delta != null ? "best " + deltaText(v.metric_delta) : "") +
        cell(fmtInt(r.steps), ratioText(v.steps_ratio, "")) +
        cell(fmtDuration(r.wall_time_s), ratioText(v.wall_time_ratio, "")) +
        cell(fmtBatch(r.mean_batch_size), sizeText(v.mean_batch_size_ratio)) +
        "</tr>";
    });
    box.innerHTML = '<table id="comparison-table"><thead><tr><th>Schedule</th><th>' + esc(capital(metric().label)) + '</th><th>Steps</th><th>Wall time</th><th>Mean batch</th></tr></thead><tbody>' +
      rows.join("") + "</tbody></table>";
    el("comparison-note").textContent = S.comparison[0].role !== "best" ? "no best trial yet" :
      "under each baseline: the best schedule against it" + (S.study.finished ? "" : " (so far)");
  }

  // ---------------------------------------------------------------- parameter importance

  function loadImportance(force) {
    var imp = S.importance;
    if (imp.pending) return;
    var done = S.study.trials_done;
    if (!force && (done === imp.trialsDone || Date.now() - imp.at < 15000)) return;
    imp.pending = true;
    fetch(S.links.importance, { headers: { Accept: "application/json" } })
      .then(function (res) { return res.ok ? res.json() : Promise.reject(res.status); })
      .then(function (result) {
        imp.trialsDone = done;
        renderImportance(result);
      }, function () {
        el("importance-note").textContent = "could not load parameter importance";
      })
      .then(function () {
        imp.at = Date.now();
        imp.pending = false;
      });
  }

  function renderImportance(result) {
    var node = el("chart-importance");
    el("importance-note").textContent = result.available ? result.note : "";
    node.dataset.available = result.available ? "true" : "false";
    if (!result.available) {
      emptyChart(node, result.note);
      return;
    }
    var palette = [COLORS.best, "#f59e0b"];
    var order = result.objectives[0].params.slice(0, 12).map(function (p) { return p.name; });
    var traces = result.objectives.map(function (o, i) {
      var values = {};
      o.params.forEach(function (p) { values[p.name] = p.importance; });
      return {
        type: "bar", orientation: "h", name: o.name, y: order.slice().reverse(),
        x: order.slice().reverse().map(function (n) { return values[n] || 0; }),
        marker: { color: palette[i % palette.length] },
        hovertemplate: "%{y}: %{x:.1%}<extra>" + esc(o.name) + "</extra>",
      };
    });
    node.style.height = Math.max(160, 60 + order.length * 24 * Math.max(1, traces.length * 0.7)) + "px";
    draw(node, traces, baseLayout({
      margin: { l: 110, r: 14, t: traces.length > 1 ? 30 : 8, b: 36 },
      showlegend: traces.length > 1, barmode: "group",
      xaxis: axis({ tickformat: ".0%", title: { text: "share of importance (PED-ANOVA)" }, rangemode: "tozero" }),
      yaxis: axis({ automargin: true }),
    }));
  }

  // ---------------------------------------------------------------- trial table

  function compareRows(a, b) {
    var key = S.sort.key, dir = S.sort.dir;
    var x = a[key], y = b[key];
    var missX = x == null || x === "", missY = y == null || y === "";
    if (missX || missY) {
      if (missX && missY) return a.number - b.number;
      return missX ? 1 : -1; // missing values last, whatever the direction
    }
    var c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return c !== 0 ? c * dir : a.number - b.number;
  }

  function matches(t, needle) {
    if (!needle) return true;
    var hay = ["#" + t.number, t.status, t.stop_reason, t.baseline, t.baseline ? baselineLabel(t.baseline) + " baseline" : "",
      t.summary, t.number === bestNumber() ? "best" : ""].join(" ").toLowerCase();
    return needle.split(/\s+/).every(function (w) { return hay.indexOf(w) >= 0; });
  }

  // The search view: one lane per trial (the most recent ones when there are many, plus
  // the baselines and the best), its epochs coloured by who trained them, and its probes.
  function renderLanes() {
    var node = el("chart-lanes");
    var best = bestNumber();
    var all = trialList().filter(function (t) { return S.lanes.has(t.number) && S.lanes.get(t.number).segments.length; });
    var keep = all.filter(function (t) { return t.baseline || t.number === best || t.number === S.picked; });
    var rest = all.filter(function (t) { return keep.indexOf(t) < 0; }).slice(-Math.max(0, MAX_LANES - keep.length));
    var shown = keep.concat(rest).sort(function (a, b) { return a.number - b.number; });
    var forks = 0, clones = 0, probes = 0;
    all.forEach(function (t) {
      var lane = S.lanes.get(t.number);
      lane.segments.forEach(function (g) { if (g[2] === "fork") forks += 1; if (g[2] === "clone") clones += 1; });
      probes += lane.probes.length;
    });
    var note = forks + (forks === 1 ? " fork, " : " forks, ") + clones + (clones === 1 ? " PBT clone, " : " PBT clones, ") +
      probes + (probes === 1 ? " cooldown probe" : " cooldown probes") + (S.live ? " so far" : "");
    if (shown.length < all.length) note += " · showing " + shown.length + " of " + all.length + " trials";
    el("search-note").textContent = note;
    if (!shown.length) {
      emptyChart(node, "No epoch has been reported yet.");
      return;
    }
    var kinds = {
      own: { name: "trained", color: "rgba(100, 116, 139, 0.55)" },
      fork: { name: "forked prefix (trained once, by the trial named)", color: "rgba(5, 150, 105, 0.55)" },
      clone: { name: "cloned state (PBT)", color: "rgba(124, 58, 237, 0.55)" },
    };
    var bars = {};
    Object.keys(kinds).forEach(function (k) { bars[k] = { y: [], base: [], x: [], text: [], hover: [] }; });
    var probeX = [], probeY = [], probeAcc = [];
    shown.forEach(function (t) {
      var lane = S.lanes.get(t.number);
      var label = "#" + t.number + (t.baseline ? " " + baselineLabel(t.baseline) : t.number === best ? " best" : "");
      lane.segments.forEach(function (g) {
        var b = bars[g[2]] || bars.own;
        b.y.push(label);
        b.base.push(g[0]);
        b.x.push(g[1] - g[0]);
        // At the segment's start, past the probe diamond on its boundary (the middle of a
        // segment often is another probe epoch, whose diamond covered the label).
        b.text.push(g[2] === "own" || g[3] === null ? "" : "\u2003#" + g[3]);
        b.hover.push(g[2] === "own" ? "trial #" + t.number + " trained epochs " + (g[0] + 1) + "-" + g[1] :
          (g[2] === "fork" ? "forked from " : "cloned from ") + (g[3] === null ? "a saved prefix" : "#" + g[3]) +
          ": epochs " + (g[0] + 1) + "-" + g[1]);
      });
      lane.probes.forEach(function (p) {
        probeX.push(p[0]);
        probeY.push(label);
        probeAcc.push(p[1]);
      });
    });
    var traces = Object.keys(kinds).filter(function (k) { return bars[k].y.length; }).map(function (k) {
      return {
        type: "bar", orientation: "h", name: kinds[k].name, y: bars[k].y, x: bars[k].x, base: bars[k].base,
        marker: { color: kinds[k].color, line: { width: 1, color: "#ffffff" } }, text: bars[k].text,
        customdata: bars[k].hover, textposition: "inside", insidetextanchor: "start",
        textfont: { size: 10.5, color: "#ffffff" }, hovertemplate: "%{customdata}<extra></extra>", meta: k,
      };
    });
    if (probeX.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "cooldown probe", x: probeX, y: probeY, customdata: probeAcc,
        marker: { symbol: "diamond", size: 8, color: COLORS.best, line: { width: 1, color: "#ffffff" } },
        hovertemplate: "probe after epoch %{x}: %{customdata:" + metricD3() + "}<extra></extra>", meta: "probe",
      });
    }
    node.style.height = Math.max(220, 90 + 24 * shown.length) + "px";
    draw(node, traces, baseLayout({
      barmode: "overlay",
      bargap: 0.2,
      xaxis: axis({ title: { text: "epoch" }, rangemode: "tozero" }),
      yaxis: axis({ type: "category", autorange: "reversed", categoryorder: "array",
        categoryarray: shown.map(function (t) {
          return "#" + t.number + (t.baseline ? " " + baselineLabel(t.baseline) : t.number === best ? " best" : "");
        }) }),
    }));
  }

  function renderTable() {
    var best = bestNumber();
    var names = baselineNames();
    var all = trialList();
    var rows = all.filter(function (t) { return matches(t, S.filter); }).sort(compareRows);
    var shown = S.showAllRows ? rows : rows.slice(0, TABLE_ROWS);
    var html = shown.map(function (t) {
      var tags = "";
      if (t.number === best) tags += '<span class="badge badge-best">★ best</span> ';
      if (t.baseline) {
        tags += '<span class="badge badge-baseline" style="color:' + baselineColor(t.baseline, names) +
          '" title="baseline ' + esc(t.baseline) + ": " + esc(baselineLabel(t.baseline)) + '">baseline · ' +
          esc(t.baseline.replace(/_/g, " ")) + "</span>";
      }
      var yaml = t.status === "running" ? '<span class="muted">—</span>' :
        '<a class="yaml-link" href="' + esc(trialYaml(t.number)) + '" download title="Download trial ' + t.number + ' schedule YAML">YAML</a>';
      return '<tr data-number="' + t.number + '" class="' + (t.number === best ? "is-best" : "") + (t.number === S.picked ? " is-picked" : "") + '">' +
        '<td><span class="trial-num">' + t.number + "</span>" + tags + "</td>" +
        '<td><span class="badge badge-' + esc(t.status) + '">' + (t.status === "running" ? '<span class="dot"></span>' : "") + esc(t.status) + "</span></td>" +
        '<td class="reason" title="' + esc(t.stop_reason || "") + '">' + esc(t.stop_reason || "") + "</td>" +
        '<td class="schedule">' + (t.summary ? fmtSummary(t.summary) : "invalid schedule") +
          (S.lanes.has(t.number) && S.lanes.get(t.number).origin ? '<div class="origin muted small">' + esc(S.lanes.get(t.number).origin) + "</div>" : "") + "</td>" +
        '<td class="num" data-value="' + (isNum(t.metric_value) ? t.metric_value : "") + '">' + fmtMetric(t.metric_value) + "</td>" +
        '<td class="num">' + fmtInt(t.steps) + "</td>" +
        '<td class="num">' + fmtDuration(t.wall_time_s) + "</td>" +
        '<td class="num">' + fmtBatch(t.mean_batch_size) + "</td>" +
        '<td class="num">' + fmtInt(t.epochs_done) + "</td>" +
        '<td class="num">' + yaml + "</td></tr>";
    }).join("");
    if (shown.length < rows.length) {
      html += '<tr class="more-rows"><td colspan="10"><button type="button" class="button button-small" id="show-all-rows">Show all ' +
        fmtInt(rows.length) + " rows</button> <span class=\"muted small\">(the first " + shown.length + " in this order are shown)</span></td></tr>";
    }
    el("trials-body").innerHTML = html || '<tr><td colspan="10" class="muted">' + (all.length ? "No trial matches the filter." : "No trials yet.") + "</td></tr>";
    el("trial-count").textContent = rows.length === all.length ? "(" + all.length + ")" : "(" + rows.length + " of " + all.length + ")";
    document.querySelectorAll("#trials-table th.sortable").forEach(function (th) {
      if (th.dataset.key === S.sort.key) th.setAttribute("aria-sort", S.sort.dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    });
  }

  function renderTableSelection() {
    document.querySelectorAll("#trials-body tr[data-number]").forEach(function (tr) {
      tr.classList.toggle("is-picked", Number(tr.dataset.number) === S.picked);
    });
  }

  // ---------------------------------------------------------------- live updates

  function renderAll() {
    renderHeader();
    renderKpis();
    renderCurves();
    renderCost();
    renderSchedule();
    renderNoiseFloor();
    renderComparison();
    renderPicker();
    renderLanes();
    renderTable();
    el("updated-at").textContent = (S.live ? "Live · updated " : "Final data · loaded ") + new Date().toLocaleTimeString();
  }

  function poll() {
    var url = S.links.data + "?since=" + encodeURIComponent(S.serverTime);
    var headers = { Accept: "application/json" };
    if (S.etag) headers["If-None-Match"] = S.etag;
    fetch(url, { cache: "no-store", headers: headers })
      .then(function (res) {
        if (res.status === 304) return null;
        if (!res.ok) return Promise.reject(res.status);
        S.etag = res.headers.get("ETag");
        var serverTime = res.headers.get("X-Server-Time");
        return res.json().then(function (data) { return { data: data, serverTime: serverTime }; });
      })
      .then(function (answer) {
        if (answer) {
          merge(answer.data, answer.serverTime);
          renderAll();
          loadImportance(!S.live);
        }
        el("live-indicator").classList.remove("is-offline");
      }, function () {
        el("updated-at").textContent = "Cannot reach the server; retrying…";
      })
      .then(function () {
        if (S.live) window.setTimeout(poll, POLL_MS);
      });
  }

  function segmented(id, onPick) {
    var buttons = document.querySelectorAll("#" + id + " .seg");
    buttons.forEach(function (btn) {
      btn.addEventListener("click", function () {
        buttons.forEach(function (b) {
          b.classList.toggle("is-active", b === btn);
          b.setAttribute("aria-pressed", b === btn ? "true" : "false");
        });
        onPick(btn);
      });
    });
  }

  function initStudy() {
    var data = JSON.parse(el("study-data").textContent);
    loadState(data);
    renderAll();
    loadImportance(true);

    document.querySelectorAll("#trials-table th.sortable").forEach(function (th) {
      th.addEventListener("click", function () {
        var key = th.dataset.key;
        S.sort = { key: key, dir: S.sort.key === key ? -S.sort.dir : 1 };
        renderTable();
      });
    });
    el("trials-body").addEventListener("click", function (ev) {
      if (ev.target.closest("#show-all-rows")) {
        S.showAllRows = true;
        renderTable();
        return;
      }
      if (ev.target.closest("a")) return;
      var tr = ev.target.closest("tr[data-number]");
      if (tr) pick(Number(tr.dataset.number));
    });
    el("trial-filter").addEventListener("input", function (ev) {
      S.filter = ev.target.value.trim().toLowerCase();
      renderTable();
    });
    el("trial-picker").addEventListener("change", function (ev) {
      pick(ev.target.value === "" ? null : Number(ev.target.value));
    });
    segmented("cost-toggle", function (btn) {
      S.cost = btn.dataset.cost;
      renderCost();
    });
    segmented("curves-toggle", function (btn) {
      S.zoom = btn.dataset.zoom;
      renderCurves();
    });
    ["chart-curves", "chart-cost"].forEach(function (id) {
      var node = el(id);
      var hook = function () {
        if (node.on && !node.dataset.clickHooked) {
          node.dataset.clickHooked = "1";
          node.on("plotly_click", function (ev) {
            var pt = ev.points && ev.points[0];
            if (pt && pt.customdata != null && isNum(Number(pt.customdata))) pick(Number(pt.customdata));
          });
        }
      };
      hook();
      node.addEventListener("mouseenter", hook);
    });
    window.setInterval(function () {
      if (!S.live) return;
      var node = el("elapsed-value");
      if (node) node.textContent = fmtDuration(elapsedNow());
    }, 1000);
    if (S.live) window.setTimeout(poll, POLL_MS);
  }

  function init() {
    var page = document.body.dataset.page;
    if (page === "studies") initStudies();
    else if (page === "study") initStudy();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
