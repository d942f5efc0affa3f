// dledger status page: polls status.json once a second and renders it (no framework, no build step).
// Renders the same markup as dledger/status/page.py, which serves the first view without JavaScript.
(function () {
  "use strict";
  var PAGE = 25, POLL_MS = 1000;
  var ui = { page: {}, filter: {}, closed: {} };
  var last = null, lastOk = 0;

  function esc(v) {
    return String(v).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function fmt(v) {
    if (v === null || v === undefined || v === "") return "\u2013";
    if (v === true) return "yes";
    if (v === false) return "no";
    if (typeof v === "number" && !Number.isInteger(v)) return String(Math.round(v * 1000) / 1000);
    return String(v);
  }
  function cell(v) {
    var cls = typeof v === "number" ? ' class="num"' : "";
    return "<td" + cls + ">" + esc(fmt(v)) + "</td>";
  }
  function kv(pairs) {
    var h = '<dl class="kv">';
    pairs.forEach(function (p) { h += "<dt>" + esc(p[0]) + "</dt><dd>" + esc(fmt(p[1])) + "</dd>"; });
    return h + "</dl>";
  }
  function spark(label, values, unit) {
    var w = 240, h = 48, pts = [], nums = values.filter(function (v) { return v !== null; });
    var max = nums.length ? Math.max.apply(null, nums) : 0;
    var now = nums.length ? nums[nums.length - 1] : null;
    values.forEach(function (v, i) {
      if (v === null) return;
      var x = values.length > 1 ? (i * (w - 2)) / (values.length - 1) + 1 : w / 2;
      var y = h - 2 - (max > 0 ? (v / max) * (h - 4) : 0);
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    return '<div class="spark"><div class="label">' + esc(label) + ": <b>" + esc(fmt(now)) + "</b> " + esc(unit) +
      " (max " + esc(fmt(max)) + ")</div>" + '<svg width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h +
      '"><polyline fill="none" stroke="#2a6fdb" stroke-width="1.5" points="' + pts.join(" ") + '"/></svg></div>';
  }
  function table(t) {
    var q = (ui.filter[t.id] || "").toLowerCase();
    var rows = q ? t.rows.filter(function (r) { return r.join(" ").toLowerCase().indexOf(q) >= 0; }) : t.rows;
    var pages = Math.max(1, Math.ceil(rows.length / PAGE));
    var page = Math.min(ui.page[t.id] || 0, pages - 1);
    ui.page[t.id] = page;
    var h = t.title ? "<h3>" + esc(t.title) + "</h3>" : "";
    if (t.rows.length > PAGE) {
      h += '<div class="pager">rows ' + (rows.length ? page * PAGE + 1 : 0) + "\u2013" +
        Math.min(rows.length, (page + 1) * PAGE) + " of " + rows.length +
        ' <button data-table="' + esc(t.id) + '" data-step="-1"' + (page === 0 ? " disabled" : "") + ">\u2039 prev</button>" +
        '<button data-table="' + esc(t.id) + '" data-step="1"' + (page >= pages - 1 ? " disabled" : "") + ">next \u203a</button>" +
        '<input type="search" placeholder="filter" id="filter-' + esc(t.id) + '" data-filter="' + esc(t.id) +
        '" value="' + esc(ui.filter[t.id] || "") + '"></div>';
    }
    h += '<table id="table-' + esc(t.id) + '"><thead><tr>';
    t.columns.forEach(function (c) { h += "<th>" + esc(c) + "</th>"; });
    h += "</tr></thead><tbody>";
    rows.slice(page * PAGE, (page + 1) * PAGE).forEach(function (r) {
      h += "<tr>" + r.map(cell).join("") + "</tr>";
    });
    if (!rows.length) h += '<tr><td colspan="' + t.columns.length + '">none</td></tr>';
    return h + "</tbody></table>";
  }
  function section(s) {
    var open = ui.closed[s.id] ? "" : " open";
    var h = '<details data-section="' + esc(s.id) + '"' + open + "><summary>" + esc(s.title) + "</summary>";
    if (s.summary.length) h += kv(s.summary);
    s.tables.forEach(function (t) { h += table(t); });
    return h + "</details>";
  }
  function render(doc) {
    var m = doc.member, h = "";
    h += '<h1>dledger group <span id="group">' + esc(doc.group) + "</span> \u2014 member " + esc(doc.self_id) + "</h1>";
    h += '<p class="sub">role <b id="role" class="role-' + esc(m.role) + '">' + esc(m.role) + "</b>, term <b id=\"term\">" +
      esc(m.term) + '</b>, leader <b id="leader">' + esc(fmt(m.leader)) + "</b></p>";
    var usage = m.disk_used_ratio === null ? null : (m.disk_used_ratio * 100).toFixed(1) + "% of the partition";
    h += kv([["log", m.begin + " .. " + m.end + " (last term " + m.end_term + ")"], ["committed", m.committed],
      ["applied", m.applied], ["pending appends", m.pending], ["store", m.store_type + ", " + m.store_bytes + " bytes"],
      ["disk used", usage], ["disk state", m.disk_problem || "ok"], ["store damaged", m.store_damaged || "no"]]);
    h += "<h2>Members</h2>";
    var c = doc.configuration;
    if (c) {
      h += '<p class="sub" id="configuration">configuration ' + (c.index === 0 ? "the bootstrap --peers" : "entry " + esc(c.index)) +
        " (" + (c.committed ? "committed" : "not committed yet: a change is in flight") + ")</p>";
    }
    h += "<table id=\"members\"><thead><tr><th>member</th><th>address</th><th>role</th><th>membership</th>" +
      "<th>lag (entries)</th><th>last contact (s ago)</th><th>disk</th></tr></thead><tbody>";
    doc.members.forEach(function (r) {
      h += '<tr data-member="' + esc(r.id) + '"' + (r.self ? ' class="self"' : "") + "><td>" + esc(r.id) + (r.self ? " (this page)" : "") +
        "</td><td>" + esc(r.address) + '</td><td class="role-' + esc(r.role) + '">' + esc(r.role) + "</td><td>" + esc(fmt(r.membership)) + "</td>" + cell(r.lag) +
        cell(r.last_contact_s) + "<td>" + esc(r.disk_problem || (r.role === "?" ? "\u2013" : "ok")) + "</td></tr>";
    });
    h += "</tbody></table>";
    var s = doc.series;
    h += '<h2>Recent history</h2><div class="sparks">' + spark("committed", s.commits_per_s, "entries/s") +
      spark("appended (as leader)", s.appends_per_s, "entries/s") + spark("append latency p99", s.latency_p99_ms, "ms") +
      spark("append latency mean", s.latency_mean_ms, "ms") + "</div>";
    h += "<h2>Elections and leadership changes (newest first)</h2>" + table({ id: "events", title: "",
      columns: ["when (s ago)", "term", "became", "leader", "reason"],
      rows: doc.events.map(function (e) { return [Math.round((doc.now - e.at) * 10) / 10, e.term, e.role, e.leader, e.reason]; }) });
    doc.sections.forEach(function (sec) { h += section(sec); });
    return h;
  }
  function draw() {
    if (!last) return;
    var active = document.activeElement, focusId = active && active.id, pos = active && active.selectionStart;
    document.getElementById("content").innerHTML = render(last);
    if (focusId) {
      var el = document.getElementById(focusId);
      if (el) { el.focus(); if (pos !== undefined && el.setSelectionRange) el.setSelectionRange(pos, pos); }
    }
  }
  function banner() {
    var b = document.getElementById("banner"), age = (Date.now() - lastOk) / 1000;
    if (lastOk && age < 3) { b.className = "banner ok"; b.textContent = "live: updated " + new Date(lastOk).toLocaleTimeString(); }
    else { b.className = "banner stale"; b.textContent = "not answering: last update " + (lastOk ? age.toFixed(0) + " s ago" : "never"); }
  }
  function poll() {
    fetch("status.json", { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    }).then(function (doc) { last = doc; lastOk = Date.now(); draw(); }).catch(function () {}).then(function () {
      banner();
      setTimeout(poll, POLL_MS);
    });
  }
  document.addEventListener("click", function (ev) {
    var t = ev.target;
    if (t.dataset && t.dataset.table) { ui.page[t.dataset.table] = (ui.page[t.dataset.table] || 0) + Number(t.dataset.step); draw(); }
  });
  document.addEventListener("input", function (ev) {
    var t = ev.target;
    if (t.dataset && t.dataset.filter) { ui.filter[t.dataset.filter] = t.value; ui.page[t.dataset.filter] = 0; draw(); }
  });
  document.addEventListener("toggle", function (ev) {
    var d = ev.target;
    if (d.dataset && d.dataset.section) ui.closed[d.dataset.section] = !d.open;
  }, true);
  poll();
})();
