/* Tally dashboard: the charts (uPlot configuration only), the live visitor count, the
   copy button and the install check. Everything else on the pages works without this file. */
(function () {
  "use strict";

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function readJson(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function axis(color, extra) {
    var base = { stroke: css("--muted"), grid: { stroke: css("--line"), width: 1 },
      ticks: { stroke: css("--line"), width: 1 }, font: "12px system-ui, sans-serif" };
    if (color) { base.stroke = color; }
    return Object.assign(base, extra || {});
  }

  function money(currency) {
    return function (u, value) {
      if (value == null) { return "–"; }
      return value.toLocaleString(undefined, { maximumFractionDigits: 2 }) + " " + currency;
    };
  }

  function mount(element, makeOptions, data) {
    var width = function () { return Math.max(280, element.clientWidth); };
    var plot = new uPlot(makeOptions(width()), data, element);
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () { plot.setSize({ width: width(), height: plot.height }); }, 50);
    });
    if (window.matchMedia) {
      // Colours come from the theme: draw again when the system switches it.
      window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () {
        plot.destroy();
        plot = new uPlot(makeOptions(width()), data, element);
      });
    }
  }

  function trafficChart() {
    var element = document.getElementById("chart");
    var points = readJson("chart-data");
    if (!element || !points || typeof uPlot === "undefined") { return; }
    var hourly = points.interval === "hour";
    var withRevenue = points.currency && points.revenue.length === points.t.length;
    var data = [points.t, points.visitors];
    if (withRevenue) { data.push(points.revenue); }
    mount(element, function (width) {
      var monthly = points.interval === "month";
      var series = [
        { label: hourly ? "Hour" : (monthly ? "Month" : "Day"),
          value: hourly ? "{YYYY}-{MM}-{DD} {HH}:00" : (monthly ? "{YYYY}-{MM}" : "{YYYY}-{MM}-{DD}") },
        { label: "Visitors", scale: "v", stroke: css("--series-1"), width: 2,
          fill: css("--accent-soft"), points: { show: points.t.length < 40 } },
      ];
      // Ticks only on whole buckets: hours for today, days or months otherwise.
      var xAxis = hourly ? { incrs: [3600, 7200, 10800, 21600], values: "{HH}:00" }
        : monthly ? { incrs: [2592000, 7776000], values: "{MMM} {YY}" }
        : { incrs: [86400, 172800, 604800, 1209600], values: "{D} {MMM}" };
      var axes = [axis(null, xAxis), axis(null, { scale: "v", size: 50 })];
      if (withRevenue) {
        series.push({ label: "Net revenue (" + points.currency + ")", scale: "m",
          stroke: css("--series-2"), width: 2, value: money(points.currency),
          points: { show: points.t.length < 40 } });
        axes.push(axis(null, { scale: "m", side: 1, size: 60, grid: { show: false } }));
      }
      return { width: width, height: 260, tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
        scales: { x: { time: true }, v: { range: function (u, min, max) { return [0, Math.max(4, max * 1.1)]; } } },
        series: series, axes: axes, cursor: { points: { size: 6 } } };
    }, data);
  }

  function movementsChart() {
    var element = document.getElementById("movements-chart");
    var payload = readJson("movements-data");
    if (!element || !payload || typeof uPlot === "undefined") { return; }
    var months = payload.months;
    var t = months.map(function (m) { return Date.parse(m.from + "T00:00:00Z") / 1000; });
    var end = months.map(function (m) { return Number(m.end_mrr); });
    var net = months.map(function (m) { return Number(m.end_mrr) - Number(m.start_mrr); });
    mount(element, function (width) {
      return { width: width, height: 240, tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
        scales: { x: { time: true } },
        legend: { live: false },
        series: [
          { label: "Month", value: "{YYYY}-{MM}" },
          { label: "MRR at month end", stroke: css("--series-1"), width: 2, value: money(payload.currency) },
          { label: "Net change", stroke: css("--series-2"), fill: css("--series-2") + "55",
            paths: uPlot.paths.bars({ size: [0.5, 40] }), value: money(payload.currency) },
        ],
        axes: [axis(null, { values: "{MMM} {YY}" }), axis(null, { size: 70 })] };
    }, [t, end, net]);
  }

  function liveCount() {
    var box = document.getElementById("live");
    var count = document.getElementById("live-count");
    if (!box || !count || !window.fetch) { return; }
    function refresh() {
      fetch(box.getAttribute("data-live-url"), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (data && data.visitors != null) { count.textContent = String(data.visitors); }
        })
        .catch(function () { /* the next refresh tries again */ });
    }
    refresh();
    setInterval(refresh, 30000);
  }

  function copyButtons() {
    document.querySelectorAll("[data-copy]").forEach(function (button) {
      var source = document.getElementById(button.getAttribute("data-copy"));
      if (!source || !navigator.clipboard) { return; }
      button.hidden = false;
      button.addEventListener("click", function () {
        navigator.clipboard.writeText(source.value).then(function () {
          button.textContent = "Copied";
          setTimeout(function () { button.textContent = "Copy"; }, 2000);
        }, function () { source.select(); });
      });
    });
    document.querySelectorAll("input.secret").forEach(function (secret) {
      secret.addEventListener("focus", function () { secret.select(); });
    });
  }

  // The install check: while no event is stored, ask every 2 s (every 10 s after five
  // minutes) and say so as soon as one is.
  function installCheck() {
    var line = document.querySelector("[data-install='waiting'][data-install-poll]");
    if (!line || !window.fetch) { return; }
    var started = Date.now();
    function receiving() {
      line.setAttribute("data-install", "receiving");
      line.setAttribute("data-seen", "yes");
      var ok = document.createElement("span");
      ok.className = "ok";
      ok.textContent = "Receiving events.";
      line.replaceChildren(ok, document.createTextNode(
        " The first event has arrived: the dashboard counts it now."));
    }
    function ask() {
      fetch(line.getAttribute("data-install-poll"), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (data && data.install === "receiving") { receiving(); } else { later(); }
        })
        .catch(later);
    }
    function later() { setTimeout(ask, Date.now() - started < 300000 ? 2000 : 10000); }
    later();
  }

  function start() {
    trafficChart();
    movementsChart();
    liveCount();
    copyButtons();
    installCheck();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
