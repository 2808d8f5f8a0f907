(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("ptestore-data").textContent);
  var regions = {};
  data.files.forEach(function (f, i) {
    f.regions.forEach(function (r) { regions[i + "-" + r.id] = {file: f, region: r}; });
  });
  var rects = Array.prototype.slice.call(document.querySelectorAll("rect.region"));
  var checked = document.querySelector("input[name=colour]:checked");
  var mode = "scale", colour = checked ? checked.value : "user", selected = null;
  function place() {
    rects.forEach(function (el) {
      var x = parseFloat(el.getAttribute(mode === "scale" ? "data-xs" : "data-xr"));
      var w = parseFloat(el.getAttribute(mode === "scale" ? "data-ws" : "data-wr"));
      var zero = el.classList.contains("zero");
      if (zero) { w = 1.5; }
      el.setAttribute("x", x.toFixed(3));
      el.setAttribute("width", w.toFixed(3));
      el.setAttribute("fill", el.getAttribute(colour === "user" ? "data-fill" : "data-sfill"));
    });
    document.querySelectorAll(".ruler .tick").forEach(function (t) {
      var x = parseFloat(t.getAttribute(mode === "scale" ? "data-xs" : "data-xr"));
      t.style.left = (x / 10).toFixed(3) + "%";
    });
  }
  function fmt(n) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + u[i];
  }
  function row(dl, k, v) {
    var dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = k; dd.textContent = v; dl.appendChild(dt); dl.appendChild(dd);
  }
  function show(id) {
    var entry = regions[id]; if (!entry) { return; }
    var r = entry.region, box = document.getElementById("details");
    box.innerHTML = "";
    var h = document.createElement("strong"); h.className = "label"; h.textContent = r.label;
    box.appendChild(h);
    var dl = document.createElement("dl"); box.appendChild(dl);
    row(dl, "file", entry.file.url);
    row(dl, "kind", r.kind + (r.category !== r.kind ? " (" + r.category + ")" : ""));
    row(dl, "bytes", "[" + r.start + ", " + (r.start + r.size) + ")  " + fmt(r.size) +
        "  (" + (100 * r.size / Math.max(1, entry.file.file_size)).toFixed(2) + "% of the file)");
    if (r.segment !== undefined) {
      row(dl, "segment", "#" + r.segment + ", offset " + r.offset + " from the segment base");
      row(dl, "alignment", r.alignment + " (largest power of two dividing the offset)");
    }
    (r.keys || []).forEach(function (k, j) {
      var t = (r.tensors || [])[j] || {};
      row(dl, "key", k + (t.dtype ? "  " + t.dtype + " [" + (t.shape || []).join(", ") + "]" : ""));
    });
    if (r.users && r.users.length) {
      row(dl, r.kind === "trailer" ? "records" : "users", r.users.join("\n"));
    }
    if (r.status) { row(dl, "change", r.status + (r.was ? "  (source: [" + r.was.start + ", " +
        (r.was.start + r.was.size) + "), segment " + r.was.segment + ")" : "")); }
  }
  function select(id) {
    if (selected) {
      document.querySelectorAll('[data-id="' + selected + '"]').forEach(function (e) {
        e.classList.remove("selected"); });
    }
    selected = id;
    document.querySelectorAll('[data-id="' + id + '"]').forEach(function (e) {
      e.classList.add("selected"); });
    show(id);
  }
  rects.forEach(function (el) {
    el.addEventListener("mouseenter", function () { show(el.getAttribute("data-id")); });
    el.addEventListener("mouseleave", function () { if (selected) { show(selected); } });
    el.addEventListener("click", function () { select(el.getAttribute("data-id")); });
  });
  document.querySelectorAll("table.regions tr[data-id]").forEach(function (tr) {
    tr.addEventListener("click", function () { select(tr.getAttribute("data-id")); });
  });
  document.querySelectorAll("input[name=mode]").forEach(function (el) {
    el.addEventListener("change", function () { mode = el.value; place(); });
  });
  document.querySelectorAll("input[name=colour]").forEach(function (el) {
    el.addEventListener("change", function () {
      colour = el.value; place();
      var lu = document.getElementById("legend-user");
      var ls = document.getElementById("legend-status");
      if (ls) { ls.hidden = colour !== "status"; lu.hidden = colour === "status"; }
    });
  });
  var tiny = rects.filter(function (el) { return parseFloat(el.getAttribute("data-ws")) < 2; });
  if (tiny.length * 4 > rects.length) {
    var r = document.querySelector("input[name=mode][value=readable]");
    if (r) { r.checked = true; mode = "readable"; }
  }
  place();
  document.body.setAttribute("data-ready", "1");
})();
