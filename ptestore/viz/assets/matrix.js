(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("ptestore-data").textContent);
  var pairs = data.pairs;
  var table = document.getElementById("matrix");
  var tbody = table.tBodies[0], headRow = table.tHead.rows[0];
  var selected = null;
  function fmtBytes(n) {
    if (n === null || n === undefined) { return "-"; }
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + u[i];
  }
  function show(i) {
    var c = pairs[i], box = document.getElementById("details");
    var lines = [
      "destination  " + c.destination + (c.ptd_destination ? " + " + c.ptd_destination : ""),
      "status       " + c.status + (c.reason ? " (" + c.reason + ")" : ""),
    ];
    if (c.error) { lines.push("error        " + c.error); }
    lines.push("artifact     " + fmtBytes(c.size) + (c.ptd_size !== null && c.ptd_size !== undefined ?
      " (.pte " + fmtBytes(c.pte_size) + ", .ptd " + fmtBytes(c.ptd_size) + ")" : ""));
    lines.push("time         " + (c.seconds || 0).toFixed(3) + " s");
    lines.push("bytes moved  " + fmtBytes(c.bytes) + " (the planner's reads " +
      fmtBytes(c.planner_bytes || 0) + ")");
    if (c.estimated_client_bytes !== undefined) {
      lines.push("estimated    " + fmtBytes(c.estimated_client_bytes) + " through the client by a run");
    }
    lines.push("compatibility " + (c.compatibility.length ? c.compatibility.join("; ") : "-"));
    box.innerHTML = "";
    var h = document.createElement("div"); h.className = "label";
    h.textContent = c.model + " on " + c.device;
    var pre = document.createElement("div"); pre.className = "mono";
    pre.textContent = lines.join("\n");
    box.appendChild(h); box.appendChild(pre);
  }
  function select(i) {
    if (selected !== null) {
      var old = table.querySelector('td.cell[data-i="' + selected + '"]');
      if (old) { old.classList.remove("selected"); }
    }
    selected = i;
    var el = table.querySelector('td.cell[data-i="' + i + '"]');
    if (el) { el.classList.add("selected"); }
    show(i);
  }
  table.addEventListener("mouseover", function (ev) {
    var td = ev.target.closest("td.cell[data-i]"); if (td) { show(+td.dataset.i); }
  });
  table.addEventListener("click", function (ev) {
    var td = ev.target.closest("td.cell[data-i]");
    if (td) { select(+td.dataset.i); return; }
    var th = ev.target.closest("th.dev");
    if (th) { sortModelsByDevice(th.dataset.device); }
  });
  var failures = document.getElementById("failures");
  if (failures) {
    failures.addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr[data-i]"); if (tr) { select(+tr.dataset.i); }
    });
  }
  // per model / per device aggregates, for sorting
  function agg(key) {
    var out = Object.create(null);  // keyed by names: "__proto__" is a name too
    pairs.forEach(function (c) {
      var a = out[c[key]] || (out[c[key]] = {failed: 0, seconds: 0, size: 0, bytes: 0});
      a.failed += c.status === "failed" ? 1 : 0; a.seconds += c.seconds || 0;
      a.size += c.size || 0; a.bytes += c.bytes || 0;
    });
    return out;
  }
  var byModel = agg("model"), byDevice = agg("device");
  function order(names, stats, how) {
    var sorted = names.slice();
    if (how === "name") { sorted.sort(); return sorted; }
    sorted.sort(function (a, b) { return (stats[b][how] - stats[a][how]) || (a < b ? -1 : 1); });
    return sorted;
  }
  function sortRows(names) {
    var rows = Object.create(null);
    Array.prototype.forEach.call(tbody.rows, function (tr) { rows[tr.dataset.model] = tr; });
    var frag = document.createDocumentFragment();
    names.forEach(function (n) { frag.appendChild(rows[n]); });
    tbody.appendChild(frag);
  }
  function sortColumns(names) {
    var rank = Object.create(null);
    names.forEach(function (n, i) { rank[n] = i; });
    function reorder(tr, selector) {
      var cells = Array.prototype.slice.call(tr.querySelectorAll(selector));
      cells.sort(function (a, b) { return rank[a.dataset.device] - rank[b.dataset.device]; });
      var frag = document.createDocumentFragment();
      cells.forEach(function (c) { frag.appendChild(c); });
      tr.appendChild(frag);
    }
    reorder(headRow, "th.dev");
    Array.prototype.forEach.call(tbody.rows, function (tr) { reorder(tr, "td.cell"); });
  }
  var statusRank = {"failed": 0, "would run": 1, "done": 2, "skipped": 3};
  function sortModelsByDevice(device) {
    var s = Object.create(null);
    pairs.forEach(function (c) {
      if (c.device === device) { s[c.model] = statusRank[c.status]; }
    });
    var names = data.models.slice();
    function rank(m) { return m in s ? s[m] : 9; }  // failed is 0: not "no pair" (9)
    names.sort(function (a, b) { return (rank(a) - rank(b)) || (a < b ? -1 : 1); });
    sortRows(names);
  }
  document.getElementById("sort-model").addEventListener("change", function (ev) {
    sortRows(order(data.models, byModel, ev.target.value));
  });
  document.getElementById("sort-device").addEventListener("change", function (ev) {
    sortColumns(order(data.devices, byDevice, ev.target.value));
  });
  function matcher(text) {
    text = text.trim();
    if (!text) { return function () { return true; }; }
    if (text.length > 2 && text[0] === "/" && text[text.length - 1] === "/") {
      try { var re = new RegExp(text.slice(1, -1), "i");
            return function (s) { return re.test(s); }; } catch (e) { /* as text */ }
    }
    var low = text.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(low) >= 0; };
  }
  function filter() {
    var mm = matcher(document.getElementById("filter-model").value);
    var dm = matcher(document.getElementById("filter-device").value);
    var wanted = {};
    document.querySelectorAll("input[name=status]").forEach(function (el) {
      wanted[el.value] = el.checked; });
    var shownDevices = Object.create(null);
    data.devices.forEach(function (d) { shownDevices[d] = dm(d); });
    table.querySelectorAll("th.dev").forEach(function (th) {
      th.hidden = !shownDevices[th.dataset.device]; });
    var rowsShown = 0, cellsShown = 0;
    Array.prototype.forEach.call(tbody.rows, function (tr) {
      var show = mm(tr.dataset.model);
      tr.hidden = !show;
      if (show) { rowsShown++; }
      Array.prototype.forEach.call(tr.cells, function (td) {
        if (!td.classList.contains("cell")) { return; }
        td.hidden = !shownDevices[td.dataset.device];
        var on = !td.dataset.status || wanted[td.dataset.status];
        td.classList.toggle("dim", !on);
        if (show && !td.hidden && on && td.dataset.i) { cellsShown++; }
      });
    });
    document.getElementById("shown").textContent = rowsShown + " models, " +
      data.devices.filter(function (d) { return shownDevices[d]; }).length + " devices, " +
      cellsShown + " pairs shown";
  }
  ["filter-model", "filter-device"].forEach(function (id) {
    document.getElementById(id).addEventListener("input", filter); });
  document.querySelectorAll("input[name=status]").forEach(function (el) {
    el.addEventListener("change", filter); });
  document.getElementById("cell-text").addEventListener("change", function (ev) {
    var how = ev.target.value;
    table.classList.toggle("text", !!how);
    table.querySelectorAll("td.cell[data-i]").forEach(function (td) {
      var c = pairs[+td.dataset.i];
      td.textContent = how === "size" ? (c.size === null ? "" : fmtBytes(c.size)) :
        how === "seconds" ? (c.seconds ? c.seconds.toFixed(2) : "") : "";
    });
  });
  filter();
  document.body.setAttribute("data-ready", "1");
})();
