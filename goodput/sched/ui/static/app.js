/* goodput dashboard: reads /ui/api/* with the viewer's token (live) or the JSON embedded in the page
 * (static report), and draws both with the same code. Every value is put in the page as text, never
 * as markup. Charts: Chart.js (shipped beside this file). Times: the viewer's own time zone. */
(function () {
  "use strict";
  var TOKEN_KEY = "goodput.token";
  var POLL_MS = 2000;
  var CELLS_MAX = 64;  // GPU cells drawn per node; a node (or a log) claiming more shows the rest as a count
  // gen: bumped by every request and by signing out; an answer to an older one is dropped, never drawn
  var state = { data: null, charts: {}, timer: null, view: "", jobTimer: null, gen: 0 };
  var embedded = document.getElementById("goodput-data");
  var STATIC = embedded ? JSON.parse(embedded.textContent) : null;

  // ------------------------------------------------------------------ small helpers
  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, k) || attrs[k] === null || attrs[k] === undefined) continue;
        if (k === "text") e.textContent = String(attrs[k]);
        else if (k === "cls") e.className = attrs[k];
        else if (k === "style") e.style.cssText = attrs[k];  // the CSSOM: the page's policy allows no inline style attribute
        else e.setAttribute(k, attrs[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      if (Array.isArray(c)) c.forEach(function (x) { if (x) e.appendChild(typeof x === "string" ? document.createTextNode(x) : x); });
      else e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  function clear(n) { while (n.firstChild) n.removeChild(n.firstChild); return n; }
  function num(x, d) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toLocaleString(undefined, { maximumFractionDigits: d === undefined ? 1 : d });
  }
  function gpuh(gpuS) {  // GPU-seconds shown as GPU-hours, small losses with 3 significant digits, never rounded to 0
    if (gpuS === null || gpuS === undefined || !isFinite(gpuS)) return "–";
    var h = gpuS / 3600;
    if (h === 0) return "0";
    return Math.abs(h) >= 1 ? num(h, 2) : String(Number(h.toPrecision(3)));
  }
  function dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    var neg = s < 0; s = Math.abs(s);
    var out;
    if (s < 90) out = Math.round(s) + " s";
    else if (s < 5400) out = (s / 60).toFixed(1) + " min";
    else if (s < 172800) out = (s / 3600).toFixed(1) + " h";
    else out = (s / 86400).toFixed(1) + " d";
    return neg ? "−" + out : out;
  }
  function clock() { return (state.data && state.data.clock) || (STATIC && STATIC.clock) || "wall"; }
  function when(t) {
    if (t === null || t === undefined || !isFinite(t)) return "–";
    if (clock() === "wall") return new Date(t * 1000).toLocaleString();
    return "t+" + dur(t);
  }
  function whenShort(t) {
    if (clock() === "wall") return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
    var h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60);
    return h + "h" + (m < 10 ? "0" : "") + m;
  }
  function hue(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
    return h % 360;
  }
  function jobColour(id) { return "hsl(" + hue(id) + ", 65%, 42%)"; }
  function jobLink(id, label) {
    if (!id) return el("span", { text: label || "(another tenant)", cls: "note" });
    return el("a", { href: "#job/" + encodeURIComponent(id), text: label || id });
  }
  function scroll(label, t) {  // a long table scrolls in its own region, reachable by the keyboard
    return el("div", { cls: "scroll", tabindex: "0", role: "region", "aria-label": label }, t);
  }
  function table(caption, heads, rows, numeric) {
    var t = el("table");
    if (caption) t.appendChild(el("caption", { cls: "sr-only", text: caption }));
    var tr = el("tr");
    heads.forEach(function (h, i) { tr.appendChild(el("th", { scope: "col", text: h, cls: numeric && numeric[i] ? "num" : null })); });
    t.appendChild(el("thead", null, tr));
    var tb = el("tbody");
    rows.forEach(function (r) {
      var row = el("tr", r.cls ? { cls: r.cls } : null);
      r.cells.forEach(function (c, i) {
        var td = el("td", numeric && numeric[i] ? { cls: "num" } : null);
        if (c instanceof Node) td.appendChild(c); else td.textContent = c === null || c === undefined ? "–" : String(c);
        row.appendChild(td);
      });
      tb.appendChild(row);
    });
    t.appendChild(tb);
    return t;
  }
  function panel(id, title) {
    var s = el("section", { id: id, cls: "panel", "aria-labelledby": id + "-h" });
    s.appendChild(el("h2", { id: id + "-h", text: title }));
    return s;
  }
  function setStatus(msg) { document.getElementById("status").textContent = msg; }
  // the service did not answer (restarting, 503, the network): what is shown stays, marked as old
  function stale(msg) {
    var app = document.getElementById("app"), b = document.getElementById("stale");
    if (!msg) { if (b) b.hidden = true; return; }
    if (!b) { b = el("p", { id: "stale", cls: "error", role: "alert" }); app.insertBefore(b, app.firstChild); }
    b.hidden = false;
    b.textContent = "Not updated since " + (state.lastOk ? state.lastOk.toLocaleTimeString() : "the page opened") + ": " + msg + " (retrying)";
  }

  // ------------------------------------------------------------------ auth and fetching
  function token() { try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; } }
  function showLogin(msg) {
    state.gen++;  // an answer still on its way (to the token just dropped) is not drawn
    stopPolling();
    destroyCharts();
    document.getElementById("app").hidden = true;
    clear(document.getElementById("app"));
    document.getElementById("login").hidden = false;
    document.getElementById("logout").hidden = true;
    document.getElementById("who").textContent = "";
    document.getElementById("login-error").textContent = msg || "";
    setStatus("");
    document.getElementById("token").focus();
  }
  function api(path) {
    return fetch(path, { headers: { Authorization: "Bearer " + token() }, cache: "no-store", credentials: "omit" }).then(function (r) {
      if (r.status === 401 || (r.status === 403 && /^\/ui\/api\/overview/.test(path))) {
        var err = new Error("unauthorized"); err.status = 401; err.code = r.status; throw err;
      }
      if (!r.ok) {
        return r.json().catch(function () { return {}; }).then(function (b) {
          var e = new Error((b && b.detail) || ("HTTP " + r.status)); e.status = r.status; throw e;
        });
      }
      return r.json();
    });
  }
  function stopPolling() {
    if (state.timer) { clearTimeout(state.timer); state.timer = null; }
  }
  function schedule() {
    stopPolling();
    if (!STATIC) state.timer = setTimeout(refresh, document.hidden ? 5 * POLL_MS : POLL_MS);  // a hidden tab asks less
  }
  function decodeId(s) {  // a hash anyone can write: a malformed escape is no job, not a stopped page
    try { return decodeURIComponent(s); } catch (e) { return null; }
  }
  function refresh() {
    var route = location.hash.replace(/^#/, "");
    var m = /^job\/(.+)$/.exec(route);
    var id = m ? decodeId(m[1]) : null;
    var p;
    if (STATIC) {
      if (m) renderJob(id !== null && Object.prototype.hasOwnProperty.call(STATIC.job_pages, id) ? STATIC.job_pages[id] : null, id === null ? m[1] : id);
      else renderOverview(STATIC);
      return;
    }
    var tok = token();
    if (!tok) { showLogin(""); return; }
    if (m && id === null) { renderJob(null, m[1]); schedule(); return; }
    var gen = ++state.gen;
    // drawn only if nothing was asked since (signing in or out asks anew) and with the same token
    function current() { return gen === state.gen && token() === tok; }
    p = m ? api("/ui/api/jobs/" + encodeURIComponent(id)) : api("/ui/api/overview");
    p.then(function (d) {
      if (!current()) return;
      document.getElementById("login").hidden = true;
      document.getElementById("logout").hidden = false;
      if (m) renderJob(d, id); else renderOverview(d);
      state.lastOk = new Date();
      stale("");
      setStatus("updated " + state.lastOk.toLocaleTimeString());
      schedule();
    }).catch(function (e) {
      if (!current()) return;  // a refusal of a token already replaced must not drop the new one
      if (e.status === 401) {
        try { sessionStorage.removeItem(TOKEN_KEY); } catch (err) { /* private mode */ }
        showLogin(e.code === 403 ? "This token cannot view the dashboard (a job token only reports its commits)."
          : "That token was not accepted (unknown or expired).");
        return;
      }
      if (m && e.status === 404) { renderJob(null, id); schedule(); return; }
      var msg = "update failed: " + e.message + " (retrying)";
      setStatus(msg);
      if (!document.getElementById("login").hidden) document.getElementById("login-error").textContent = msg;
      else stale(e.message);
      schedule();
    });
  }

  // ------------------------------------------------------------------ charts
  function destroyCharts() {
    for (var k in state.charts) { if (state.charts[k]) state.charts[k].destroy(); }
    state.charts = {};
  }
  function chart(key, canvas, config) {
    var c = state.charts[key];
    if (c && c.canvas === canvas) {
      c.data.labels = config.data.labels;
      config.data.datasets.forEach(function (ds, i) {
        if (c.data.datasets[i]) c.data.datasets[i].data = ds.data; else c.data.datasets.push(ds);
      });
      c.data.datasets.length = config.data.datasets.length;
      c.update("none");
      return c;
    }
    if (c) c.destroy();
    if (typeof Chart === "undefined") { canvas.replaceWith(el("p", { cls: "error", text: "chart library missing" })); return null; }
    config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false }, config.options || {});
    state.charts[key] = new Chart(canvas, config);
    return state.charts[key];
  }
  function canvasFor(key, label) {
    var id = "chart-" + key;
    var old = document.getElementById(id);
    if (old) return old;
    return el("canvas", { id: id, role: "img", "aria-label": label });
  }
  var CAUSES = [
    ["useful", "useful", "#15803d"],
    ["lost_preemption", "lost: preemption", "#b91c1c"],
    ["lost_failure", "lost: failures + infra", "#9a3412"],
    ["restart", "restart", "#a16207"],
    ["checkpoint_stall", "checkpoint stall", "#6d28d9"],
    ["draining", "draining", "#0369a1"],
    ["double_booked", "double-booked", "#be185d"],
    ["at_risk", "at risk (running)", "#ca8a04"],
    ["unattributed", "unattributed", "#57534e"],
    ["idle", "idle", "#9ca3af"]
  ];

  // ------------------------------------------------------------------ the overview
  // a re-render keeps the keyboard focus and the open <details> of the page it replaces
  function keep(fn) {
    var a = document.activeElement, href = a && a.getAttribute ? a.getAttribute("href") : null;
    var open = {};
    Array.prototype.forEach.call(document.querySelectorAll("details[data-key]"), function (x) { if (x.open) open[x.getAttribute("data-key")] = 1; });
    var tops = {};
    Array.prototype.forEach.call(document.querySelectorAll(".scroll[aria-label]"), function (x) { tops[x.getAttribute("aria-label")] = x.scrollTop; });
    var focusedRegion = a && a.classList && a.classList.contains("scroll") ? a.getAttribute("aria-label") : null;
    fn();
    Array.prototype.forEach.call(document.querySelectorAll("details[data-key]"), function (x) { if (open[x.getAttribute("data-key")]) x.open = true; });
    Array.prototype.forEach.call(document.querySelectorAll(".scroll[aria-label]"), function (x) {
      var label = x.getAttribute("aria-label");
      if (tops[label]) x.scrollTop = tops[label];
      if (focusedRegion === label && document.activeElement !== x) x.focus({ preventScroll: true });
    });
    if (href && document.activeElement !== a) {
      var again = document.querySelector('#app a[href="' + href.replace(/["\\]/g, "") + '"]');
      if (again) again.focus({ preventScroll: true });
    }
  }

  function renderOverview(d) { keep(function () { renderOverview1(d); }); }
  function renderOverview1(d) {
    state.data = d;
    var app = document.getElementById("app");
    if (state.view !== "overview") { destroyCharts(); clear(app); state.view = "overview"; }
    app.hidden = false;
    var v = d.viewer || {};
    document.getElementById("who").textContent = d.mode === "static"
      ? "static report of " + num(d.records, 0) + " events (at its last record, " + when(d.now) + ")"
      : (v.admin ? "admin: every tenant" : "tenant " + v.tenant + ": your jobs; the cluster's shape");
    if (d.title) { document.getElementById("title").textContent = d.title; document.title = d.title; }
    var banner = document.getElementById("degraded");
    if (d.degraded && !banner) { banner = el("p", { id: "degraded", cls: "error", role: "alert" }); app.insertBefore(banner, app.firstChild); }
    if (banner) { banner.hidden = !d.degraded; banner.textContent = d.degraded ? "The service is degraded, what is shown may be stale: " + d.degraded : ""; }
    if (d.notes && d.notes.length && !document.getElementById("notes")) app.appendChild(el("p", { id: "notes", cls: "note", text: d.notes.join("; ") }));
    var sections = [
      ["summary", "Summary", drawSummary],
      ["cluster", "Cluster", drawCluster],
      ["queue", "Queue", drawQueue],
      ["running", "Running jobs", drawRunning],
      ["preemptions", "Preemptions", drawPreemptions],
      ["goodput", "Goodput and the badput ledger", drawGoodput]
    ];
    if (d.policies && d.policies.length) sections.push(["policies", "Policies compared", drawPolicies]);
    if (!document.getElementById("nav")) {
      var nav = el("nav", { id: "nav", cls: "tabs", "aria-label": "Sections" });
      sections.forEach(function (s) { nav.appendChild(el("a", { href: "#" + s[0], text: s[1], "data-section": s[0] })); });
      app.appendChild(nav);
    }
    sections.forEach(function (s) {
      var sec = document.getElementById(s[0]);
      if (!sec) { sec = panel(s[0], s[1]); app.appendChild(sec); }
      var body = sec.querySelector(".body");
      if (!body) { body = el("div", { cls: "body" }); sec.appendChild(body); }
      s[2](body, d);
    });
  }

  function drawSummary(body, d) {
    clear(body);
    var c = d.counts || {};
    var items = [];
    if (d.viewer && !d.viewer.admin) {
      items = [["your pending", c.pending], ["your running", c.running], ["pending (all tenants)", c.pending_all], ["running (all tenants)", c.running_all]];
    } else {
      items = [["pending", c.pending || 0], ["running", c.running || 0], ["preempting", c.preempting || 0], ["finished", c.finished || 0], ["failed", c.failed || 0], ["cancelled", c.cancelled || 0]];
      if (c.gpus !== undefined) items.push(["GPUs up", c.gpus], ["GPUs bound", c.gpus_bound], ["GPUs draining", c.gpus_draining], ["nodes lost", c.nodes_lost]);
    }
    var s = el("div", { cls: "summary" });
    items.forEach(function (it) { s.appendChild(el("div", null, el("b", { text: num(it[1], 0) }), it[0])); });
    body.appendChild(s);
  }

  function drawCluster(body, d) {
    clear(body);
    var snaps = d.cluster_at || [];
    if (!snaps.length) { drawGrid(body, d.cluster); return; }
    // a static report: the cluster at any of its snapshots, by default the busiest
    if (state.clusterIdx === undefined) {
      var best = 0, most = -1;
      snaps.forEach(function (sn, i) {
        var used = sn.cluster.nodes.reduce(function (a, n) { return a + n.used; }, 0);
        if (used > most) { most = used; best = i; }
      });
      state.clusterIdx = best;
    }
    var out = el("output", { id: "cluster-at-value", "for": "cluster-at" });
    var slider = el("input", { id: "cluster-at", type: "range", min: "0", max: String(snaps.length - 1), step: "1", value: String(state.clusterIdx) });
    var grid = el("div", { id: "cluster-grid" });
    function show() {
      var sn = snaps[state.clusterIdx];
      out.textContent = when(sn.t) + (state.clusterIdx === snaps.length - 1 ? " (the log's end)" : "");
      drawGrid(clear(grid), sn.cluster);
    }
    slider.addEventListener("input", function () { state.clusterIdx = Number(slider.value); show(); });
    body.appendChild(el("p", null, el("label", { "for": "cluster-at", text: "Cluster at " }), slider, " ", out));
    body.appendChild(grid);
    show();
  }

  function drawGrid(body, cluster) {
    var nodes = cluster.nodes;
    body.appendChild(el("div", { cls: "legend", "aria-hidden": "true" },
      el("span", null, el("i", { cls: "cell" }), "idle"),
      el("span", null, el("i", { cls: "cell", style: "background:" + jobColour("busy") }), "busy (colour per job)"),
      el("span", null, el("i", { cls: "cell draining", style: "background-color:" + jobColour("busy") }), "draining (a victim leaving)"),
      el("span", null, el("i", { cls: "cell other" }), "another tenant's job"),
      el("span", null, el("i", { cls: "cell lost" }), "lost node"),
      el("span", null, el("span", { cls: "badge on-demand", text: "on-demand" })),
      el("span", null, el("span", { cls: "badge spot", text: "spot" })),
      el("span", null, "dashed orange: reclaim or drain notice")));
    var idle = 0, busy = 0, draining = 0, lost = 0;
    var grid = el("div", { cls: "nodes" + (nodes.length > 96 ? " compact" : ""), role: "list", "aria-label": "nodes and their GPUs" });
    nodes.forEach(function (n) {
      var flag = n.health === "lost" ? "LOST" : n.health === "reclaiming" ? "notice" + (n.notice_s ? " until " + whenShort(n.notice_s) : "") : "";
      var used = 0, parts = [];
      var cells = el("span", { cls: "cells" });
      var drawn = 0;
      n.segments.forEach(function (s) {
        for (var i = 0; i < s.gpus && drawn < CELLS_MAX; i++, drawn++) {
          var cell = el("i", { cls: "cell" + (s.job ? "" : " other") + (s.state === "draining" ? " draining" : "") });
          if (s.job) cell.style.backgroundColor = jobColour(s.job);
          cells.appendChild(cell);
        }
        used += s.gpus;
        if (s.state === "draining") draining += s.gpus; else busy += s.gpus;
        parts.push(s.gpus + " " + s.state + " (" + (s.job || "another tenant") + ")");
      });
      for (var i = used; i < n.gpus && drawn < CELLS_MAX; i++, drawn++) cells.appendChild(el("i", { cls: "cell" + (n.health === "lost" ? " lost" : "") }));
      if (n.gpus > drawn || used > drawn) cells.appendChild(el("span", { cls: "note", text: " +" + num(Math.max(n.gpus, used) - drawn, 0) + " GPUs" }));
      if (n.health === "lost") lost += n.gpus; else idle += Math.max(0, n.gpus - used);
      var label = n.name + ", pool " + n.pool + " (" + n.kind + "), " + n.health + (flag ? " " + flag : "") + ": " +
        (parts.length ? parts.join(", ") : "all idle") + ", " + Math.max(0, n.gpus - used) + " of " + n.gpus + " GPUs free";
      var box = el("div", { cls: "node kind-" + n.kind + " health-" + n.health, role: "listitem", title: label, "aria-label": label, "data-node": n.name },
        el("span", { cls: "nname", text: n.name }), flag ? el("span", { cls: "flag", text: flag }) : null, cells);
      grid.appendChild(box);
    });
    body.appendChild(el("p", { cls: "note", text: nodes.length + " nodes; GPUs: " + busy + " busy, " + draining + " draining, " + idle + " idle, " + lost + " on lost nodes" }));
    body.appendChild(grid);
  }

  function drawQueue(body, d) {
    clear(body);
    var q = d.queue;
    var r = q.reservation;
    body.appendChild(el("p", { cls: "note", id: "reservation" }, r
      ? ["Head's reservation: ", r.job ? jobLink(r.job) : "(another tenant's job)", " at " + when(r.t) + (r.in_s !== null && r.in_s !== undefined ? " (in " + dur(r.in_s) + ")" : "") + (r.pool ? " on pool " + r.pool : "")]
      : "No reservation in force."));
    if (!q.jobs.length) body.appendChild(el("p", { text: "No pending jobs" + (q.others ? " of yours." : ".") }));
    else body.appendChild(scroll("pending jobs", table("pending jobs", ["place", "job", "tenant", "priority", "shape", "wait", "why it waits"],
      q.jobs.map(function (j) {
        return { cells: [j.place, jobLink(j.id, j.name !== j.id ? j.name + " (" + j.id + ")" : j.id), j.tenant, j.priority, j.nodes + "×" + j.gpus_per_node, dur(j.wait_s),
          el("span", { title: j.why_detail }, el("span", { cls: "badge" + (j.why === "backoff" || j.why === "quota" ? " warn" : ""), text: j.why }), " " + j.why_detail)] };
      }), [true, false, false, true, false, true, false])));
    if (q.more) body.appendChild(el("p", { cls: "note", text: q.more + " more pending job(s) not listed." }));
    if (q.others) body.appendChild(el("p", { cls: "note", text: q.others + " more pending job(s) of other tenants." }));
  }

  function drawRunning(body, d) {
    clear(body);
    var rr = d.running;
    if (!rr.jobs.length) body.appendChild(el("p", { text: "No running jobs" + (rr.others ? " of yours." : ".") }));
    else body.appendChild(scroll("running jobs", table("running jobs", ["job", "tenant", "state", "pool", "GPUs", "last commit", "interval", "tier", "work at risk (GPU-h)", "time to limit"],
      rr.jobs.map(function (j) {
        var age = dur(j.commit_age_s) + (j.committed_this_run ? " ago" : " since start (none yet)");
        return {
          cls: j.overdue ? "overdue" : null,
          cells: [jobLink(j.id, j.name !== j.id ? j.name + " (" + j.id + ")" : j.id), j.tenant,
            el("span", null, j.state + (j.substate && j.substate !== j.state ? " (" + j.substate + ")" : ""), j.victim_of ? " for " + j.victim_of : ""),
            j.pool, j.gpus,
            el("span", null, age, j.overdue ? el("span", { cls: "badge bad", text: "overdue" }) : null),
            j.interval_s ? dur(j.interval_s) : "none", j.tier || "–", gpuh(j.at_risk_gpu_s), dur(j.to_limit_s)]
        };
      }), [false, false, false, false, true, false, true, false, true, true])));
    if (rr.others) body.appendChild(el("p", { cls: "note", text: rr.others + " more running job(s) of other tenants." }));
  }

  function drawPreemptions(body, d) {
    clear(body);
    var p = d.preemptions;
    if (!p.items.length) { body.appendChild(el("p", { text: "No preemptions." })); return; }
    body.appendChild(el("p", { cls: "note", text: p.total + " preemption(s); newest first" + (p.total > p.items.length ? ", the last " + p.items.length + " shown" : "") + ". Loss in GPU-hours." }));
    body.appendChild(scroll("preemption log", table("preemption log", ["when", "victim", "reason", "preemptor", "GPUs", "checkpoint asked", "expected loss", "actual loss", "candidates (expected loss)"],
      p.items.map(function (x) {
        var cands = null;
        if (x.candidates && x.candidates.length) {
          var list = el("ol");
          x.candidates.forEach(function (c) {
            list.appendChild(el("li", null, c.job ? jobLink(c.job) : "(another tenant)", ": " + gpuh(c.lost_gpu_s || 0) + " GPU-h" + (c.checkpoint ? ", would checkpoint" : "") + (c.chosen ? " — chosen" : "")));
          });
          cands = el("details", { "data-key": "cand-" + x.t + "-" + (x.job || "") }, el("summary", { text: x.candidates.length + " considered" }), list);
        }
        return { cells: [when(x.t), jobLink(x.job), el("span", { cls: "badge", text: x.reason }),
          x.preemptor ? (x.preemptor.charAt(0) === "(" ? x.preemptor : jobLink(x.preemptor)) : (x.victim_of || "–"),
          x.gpus, x.checkpoint ? "yes" : "no", gpuh(x.expected_loss_gpu_s),
          x.realized_loss_gpu_s === null || x.realized_loss_gpu_s === undefined ? "(leaving)" : gpuh(x.realized_loss_gpu_s), cands || "–"] };
      }), [false, false, false, false, true, false, true, true, false])));
  }

  function drawGoodput(body, d) {
    var s = d.series, led = d.ledger;
    var first = !body.querySelector(".charts");
    if (first) {
      clear(body);
      body.appendChild(el("p", { cls: "note", id: "ledger-note", text: d.ledger_note || "" }));
      var charts = el("div", { cls: "charts" });
      charts.appendChild(el("figure", null, el("div", { cls: "chart" }, canvasFor("series", "GPUs over time: capacity, allocated, useful")), el("figcaption", { cls: "note", text: "GPUs over time (average per interval): capacity, allocated, useful. " + (clock() === "wall" ? "Time in your zone." : "Time since the start of the log.") })));
      charts.appendChild(el("figure", null, el("div", { cls: "chart" }, canvasFor("ledger", "badput ledger by cause, GPU-hours")), el("figcaption", { cls: "note", text: "Where the GPU-hours went, by cause." })));
      charts.appendChild(el("figure", null, el("div", { cls: "chart" }, canvasFor("tenants", "per tenant: allocated and useful against entitlement")), el("figcaption", { cls: "note", text: "Per tenant: entitlement (weight share of capacity), allocated, useful." })));
      body.appendChild(charts);
      body.appendChild(el("div", { id: "ledger-tables" }));
    }
    var labels = s.t.map(function (t) { return whenShort(t); });
    chart("series", document.getElementById("chart-series"), {
      type: "line",
      data: { labels: labels, datasets: [
        { label: "capacity", data: s.capacity, borderColor: "#6b7280", backgroundColor: "#6b7280", pointRadius: 0, borderWidth: 2, stepped: true },
        { label: "allocated", data: s.allocated, borderColor: "#1d4ed8", backgroundColor: "#1d4ed8", pointRadius: 0, borderWidth: 2 },
        { label: "useful", data: s.useful, borderColor: "#15803d", backgroundColor: "rgba(21,128,61,.2)", fill: true, pointRadius: 0, borderWidth: 2 }
      ] },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: "GPUs" } }, x: { ticks: { maxTicksLimit: 8 } } }, interaction: { mode: "index", intersect: false } }
    });
    var tot = Object.assign({}, led.total);
    var shown = CAUSES.filter(function (c) { return tot[c[0]] !== undefined; });
    var datasets = [{ label: "from the event log", data: shown.map(function (c) { return tot[c[0]]; }), backgroundColor: shown.map(function (c) { return c[2]; }) }];
    if (led.exact) {
      datasets.push({ label: "simulator's books", data: shown.map(function (c) { return led.exact[c[0]] === undefined ? null : led.exact[c[0]]; }), backgroundColor: "rgba(17,24,39,.55)" });
    }
    chart("ledger", document.getElementById("chart-ledger"), {
      type: "bar",
      data: { labels: shown.map(function (c) { return c[1]; }), datasets: datasets },
      options: { indexAxis: "y", plugins: { legend: { display: !!led.exact } }, scales: { x: { beginAtZero: true, title: { display: true, text: "GPU-hours" } } } }
    });
    var tn = led.tenants.slice().sort(function (a, b) { return (b.allocated || 0) - (a.allocated || 0); }).slice(0, 16);
    chart("tenants", document.getElementById("chart-tenants"), {
      type: "bar",
      data: { labels: tn.map(function (t) { return t.tenant; }), datasets: [
        { label: "entitled", data: tn.map(function (t) { return t.entitled || 0; }), backgroundColor: "#9ca3af" },
        { label: "allocated", data: tn.map(function (t) { return t.allocated || 0; }), backgroundColor: "#1d4ed8" },
        { label: "useful", data: tn.map(function (t) { return t.useful || 0; }), backgroundColor: "#15803d" }
      ] },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: "GPU-hours" } } } }
    });
    var box = clear(document.getElementById("ledger-tables"));
    // goodput over the GPU-time whose fate is known: a running job's uncommitted tail is neither yet
    var settled = (tot.allocated || 0) - (tot.at_risk || 0);
    var gp = settled > 0 ? tot.useful / settled : null;
    box.appendChild(el("p", null, "Goodput (useful / allocated, running jobs' uncommitted work left out): ", el("b", { id: "goodput-value", text: gp === null ? "–" : num(gp, 4) }),
      " · capacity " + num(led.capacity_gpu_h, 2) + " GPU-h · allocated " + num(tot.allocated, 2) + " GPU-h · at risk " + num(tot.at_risk || 0, 3) + " GPU-h" +
      (led.untimed_gpu_h ? " · runs without timing in their reports " + num(led.untimed_gpu_h, 3) + " GPU-h" : "")));
    box.appendChild(el("details", { "data-key": "ledger-tables" }, el("summary", { text: "ledger and tenants as tables" }),
      table("badput ledger", ["cause", "GPU-hours"].concat(led.exact ? ["simulator's books"] : []),
        shown.map(function (c) { return { cells: [c[1], num(tot[c[0]], 3)].concat(led.exact ? [num(led.exact[c[0]], 3)] : []) }; }), [false, true, true]),
      table("per tenant", ["tenant", "entitled", "allocated", "useful", "restart", "checkpoint stall", "lost: preemption", "lost: failures", "draining", "at risk", "unattributed"],
        tn.map(function (t) { return { cells: [t.tenant, num(t.entitled, 3), num(t.allocated, 3), num(t.useful, 3), num(t.restart || 0, 3), num(t.checkpoint_stall || 0, 3), num(t.lost_preemption, 3), num(t.lost_failure, 3), num(t.draining, 3), num(t.at_risk, 3), num(t.unattributed || 0, 3)] }; }),
        [false, true, true, true, true, true, true, true, true, true, true])));
  }

  function drawPolicies(body, d) {
    if (body.querySelector(".charts")) return;
    clear(body);
    var ps = d.policies;
    var charts = el("div", { cls: "charts" });
    charts.appendChild(el("figure", null, el("div", { cls: "chart" }, canvasFor("policy-goodput", "goodput by policy")), el("figcaption", { cls: "note", text: "Goodput (useful / allocated) by policy." })));
    charts.appendChild(el("figure", null, el("div", { cls: "chart" }, canvasFor("policy-badput", "badput by policy and cause")), el("figcaption", { cls: "note", text: "Badput by cause (GPU-hours: allocated but not useful), the simulator's books." })));
    body.appendChild(charts);
    chart("policy-goodput", document.getElementById("chart-policy-goodput"), {
      type: "bar",
      data: { labels: ps.map(function (p) { return p.name; }), datasets: [{ label: "goodput", data: ps.map(function (p) { return p.metrics.goodput; }), backgroundColor: "#15803d" }] },
      options: { plugins: { legend: { display: false } } }
    });
    chart("policy-badput", document.getElementById("chart-policy-badput"), {
      type: "bar",
      data: { labels: ps.map(function (p) { return p.name; }), datasets: CAUSES.filter(function (c) { return c[0] !== "useful" && c[0] !== "at_risk" && c[0] !== "unattributed" && c[0] !== "idle"; }).map(function (c) {
        return { label: c[1], data: ps.map(function (p) { return (p.metrics.ledger_gpu_hours || {})[c[0]] || 0; }), backgroundColor: c[2] };
      }) },
      options: { scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: "GPU-hours" } } } }
    });
    body.appendChild(table("policies", ["policy", "goodput", "lost GPU-h", "wait p50", "wait p99", "utilization", "violations"],
      ps.map(function (p) { var m = p.metrics; return { cells: [p.name, num(m.goodput, 4), num(m.lost_gpu_hours, 1), dur(m.wait_p50_s), dur(m.wait_p99_s), num(m.utilization, 3), m.violations] }; }),
      [false, true, true, true, true, true, true]));
  }

  // ------------------------------------------------------------------ a job's page
  // the user-visible state each record leaves the job in (docs/SCHED.md's state machine)
  var EDGE = { submitted: "pending", started: "running", preempt_requested: "preempting", requeued: "pending",
    finished: "finished", failed: "failed", cancelled: "cancelled" };
  function renderJob(j, id) {
    var key = JSON.stringify(j) + id;
    if (state.view === "job" && state.jobKey === key) return;  // unchanged: keep the page, its focus and scroll
    state.jobKey = key;
    keep(function () { renderJob1(j, id); });
  }
  function renderJob1(j, id) {
    var app = document.getElementById("app");
    destroyCharts();
    clear(app);
    state.view = "job";
    app.hidden = false;
    app.appendChild(el("nav", { cls: "tabs", "aria-label": "Back" }, el("a", { href: "#", text: "← overview" })));
    if (!j) {
      app.appendChild(el("h2", { text: "No job " + id }));
      app.appendChild(el("p", { text: STATIC ? "This report embeds the pages of the preempted, running and most recent jobs only." : "No such job, or not one of yours." }));
      return;
    }
    var sec = panel("job", "Job " + j.id);
    sec.appendChild(el("dl", { cls: "facts" }, [
      ["name", j.name], ["tenant", j.tenant], ["state", j.state + (j.substate && j.substate !== j.state ? " (" + j.substate + ")" : "")],
      ["priority", j.priority], ["shape", j.nodes + " × " + j.gpus_per_node + " GPUs"], ["submitted", when(j.submit_s)],
      ["epoch / restarts", j.epoch + " / " + j.restarts], ["preemptions, infra losses, failures", [j.preemptions, j.infra_losses, j.failures].map(function (x) { return x === undefined ? "–" : x; }).join(", ")],
      ["time limit", dur(j.limit_s)], ["checkpoint interval", j.interval_s === undefined ? "–" : (j.interval_s ? dur(j.interval_s) : "never")],
      ["committed progress", j.committed_s === undefined ? "–" : dur(j.committed_s) + (j.committed_at ? " (at " + when(j.committed_at) + ")" : "")],
      ["failure reason", j.failed_reason || "–"]
    ].reduce(function (acc, kv) { acc.push(el("dt", { text: kv[0] }), el("dd", { text: kv[1] === null || kv[1] === undefined ? "–" : String(kv[1]) })); return acc; }, [])));
    app.appendChild(sec);
    var runs = panel("job-runs", "Runs and restarts");
    if (j.runs_total > j.runs.length) runs.appendChild(el("p", { cls: "note", text: "the last " + j.runs.length + " of " + j.runs_total + " runs" }));
    runs.appendChild(table("runs", ["epoch", "pool", "nodes", "started", "resumed from", "commits", "last commit", "asked to leave", "exited", "status", "useful (GPU-h)", "restart (GPU-h)", "stall (GPU-h)", "lost (GPU-h)"],
      j.runs.map(function (r) {
        var a = r.account_gpu_s || {};
        return { cells: [r.epoch, r.pool, r.nodes.join(", "), when(r.start), dur(r.resume_from_s), r.commits, when(r.last_commit_t), when(r.preempt_t), when(r.exit_t), r.status,
          gpuh(a.useful || 0), r.ready_t === null || r.ready_t === undefined ? "unreported" : gpuh(a.restart || 0), gpuh(a.checkpoint_stall || 0),
          gpuh((a.lost_preemption || 0) + (a.lost_failure || 0))] };
      }), [true, false, false, false, true, true, false, false, false, false, true, true, true, true]));
    app.appendChild(runs);
    var ck = panel("job-checkpoints", "Checkpoints");
    if (!j.checkpoints.length) ck.appendChild(el("p", { text: "No committed checkpoint yet." }));
    else if (j.checkpoints_total > j.checkpoints.length) ck.appendChild(el("p", { cls: "note", text: "the last " + j.checkpoints.length + " of " + j.checkpoints_total + " checkpoints" }));
    else ck.appendChild(table("committed checkpoints", ["when", "epoch", "progress"], j.checkpoints.map(function (c) { return { cells: [when(c.t), c.epoch, dur(c.progress_s)] }; }), [false, true, true]));
    if (j.commits_rejected) ck.appendChild(el("p", { cls: "note", text: j.commits_rejected + " commit report(s) rejected (stale epoch or going backwards)." }));
    if (j.reports) {
      [["last_report", "Last accepted commit report (durable)"], ["last_fast_report", "Last fast-tier report"]].forEach(function (k) {
        var rep = j.reports[k[0]];
        ck.appendChild(el("h3", { text: k[1] }));
        if (!rep) { ck.appendChild(el("p", { text: "none" })); return; }
        ck.appendChild(el("dl", { cls: "facts" }, Object.keys(rep).reduce(function (acc, key) { acc.push(el("dt", { text: key }), el("dd", { text: rep[key] === null ? "–" : String(rep[key]) })); return acc; }, [])));
      });
    }
    app.appendChild(ck);
    var hist = panel("job-history", "State history");
    if (j.forgotten) hist.appendChild(el("p", { cls: "note", text: "this job ended before the newest jobs the dashboard keeps: its runs and history are no longer in its memory (the event log has them: goodput sched events)" }));
    if (j.history_total > j.history.length) hist.appendChild(el("p", { cls: "note", text: "the last " + j.history.length + " of " + j.history_total + " records" }));
    var cur = "";
    hist.appendChild(table("event history", ["when", "event", "state", "details"], j.history.map(function (h) {
      var rest = {};
      Object.keys(h).forEach(function (k) { if (k !== "t" && k !== "event" && k !== "job") rest[k] = h[k]; });
      var next = EDGE[h.event] || cur;
      var edge = next !== cur ? (cur ? cur + " → " : "") + next : "";
      cur = next;
      return { cells: [when(h.t), h.event, edge, JSON.stringify(rest)] };
    })));
    app.appendChild(hist);
    if (!STATIC) {
      var lg = panel("job-log", "Log tail");
      if (!j.log) lg.appendChild(el("p", { text: "No log file yet." }));
      else {
        if (j.log.error) lg.appendChild(el("p", { cls: "error", text: j.log.error }));
        lg.appendChild(el("p", { cls: "note", text: "epoch " + j.log.epoch + ", the last " + num(j.log.bytes_max / 1024, 0) + " KiB at most" }));
        lg.appendChild(el("pre", { cls: "log", tabindex: "0", "aria-label": "log tail", text: j.log.tail }));
      }
      app.appendChild(lg);
    }
  }

  // ------------------------------------------------------------------ start
  function start() {
    var form = document.getElementById("login-form");
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var t = document.getElementById("token").value.trim();
      if (!t) return;
      if (!/^[\x21-\x7e]{1,256}$/.test(t)) {  // a header cannot carry it: never kept, never retried
        document.getElementById("token").value = "";
        document.getElementById("login-error").textContent = "That is not a token (printable ASCII, no spaces, at most 256 characters).";
        return;
      }
      try { sessionStorage.setItem(TOKEN_KEY, t); } catch (err) { /* private mode: this page only */ }
      document.getElementById("token").value = "";
      document.getElementById("login-error").textContent = "";
      state.view = "";
      refresh();
    });
    document.getElementById("logout").addEventListener("click", function () {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (err) { /* nothing kept */ }
      state.view = "";
      showLogin("Signed out.");
    });
    window.addEventListener("hashchange", function () {
      var h = location.hash.replace(/^#/, "");
      if (/^job\//.test(h) || h === "" || state.view === "job") { state.view = state.view === "job" && !/^job\//.test(h) ? "" : state.view; refresh(); }
    });
    if (STATIC) { document.getElementById("login").hidden = true; refresh(); return; }
    if (!token()) showLogin(""); else refresh();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
